import csv,sys,re,collections
f=sys.argv[1]
rows=[]
hdr=None
for r in csv.reader(open(f)):
    if len(r)>3 and r[0]=='Address': hdr=r; continue
    if hdr and len(r)==len(hdr):
        rows.append(dict(zip(hdr,r)))
def num(s):
    s=s.replace(',','')
    try: return float(s)
    except: return 0.0
tot=sum(num(r['Instructions Executed']) for r in rows)
op=collections.Counter()
for r in rows:
    src=r['Source'].strip()
    m=re.match(r'(@!?U?P\w+\s+)?([A-Z0-9_]+)',src)
    o=m.group(2) if m else src[:10]
    op[o]+=num(r['Instructions Executed'])
print(f"rows {len(rows)} total warp inst {tot:,.0f}")
for o,c in op.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 30):
    print(f"{o:12} {c:12,.0f} {100*c/tot:5.1f}%")
