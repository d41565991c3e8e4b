import csv,sys
rows=[];hdr=None
for r in csv.reader(open(sys.argv[1])):
    if len(r)>3 and r[0]=='Address': hdr=r; continue
    if hdr and len(r)==len(hdr): rows.append(r)
ia=hdr.index('Instructions Executed'); sa=hdr.index('Source')
num=lambda s: float(s.replace(',','') or 0)
per=float(sys.argv[2])
blocks=[];cur=None
for i,r in enumerate(rows):
    c=num(r[ia])
    if cur and cur[1]==c: cur[2]+=1; cur[3].append(r[sa].strip())
    else:
        cur=[i,c,1,[r[sa].strip()]]; blocks.append(cur)
tot=0
for b in blocks:
    if b[1]==0: continue
    w=b[1]*b[2]/per; tot+=w
    if w>=float(sys.argv[3]):
        print(f"line {b[0]:6} x{b[1]/per:6.2f} n={b[2]:4} per-item {w:7.1f}  {' | '.join(s[:28] for s in b[3][:6])}")
print('total per item',tot)
