#!/bin/bash
# sc.sh PTX ENTRY -> static SASS instruction count
source /tmp/env.sh
t=$(mktemp -d); $KVIO_PTXAS -arch=sm_90 -e $2 $1 -o $t/x.cubin && /tmp/nvd/x/nvidia/cu13/bin/nvdisasm -c $t/x.cubin 2>/dev/null > $t/x.sass; grep -cE '^\s+/\*[0-9a-f]+\*/\s+[@A-Z]' $t/x.sass; cp $t/x.sass /tmp/sass/$2-$(basename $1 .ptx).sass; rm -rf $t
