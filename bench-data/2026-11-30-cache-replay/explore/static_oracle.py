import sys; sys.path[:0] = [str(__import__('pathlib').Path(__file__).resolve().parents[2]), str(__import__('pathlib').Path(__file__).resolve().parent)]
from common import tr, MIB
from collections import Counter
for name in ('qwen','gptoss'):
    t=tr[name]; eb=t.expert_bytes
    seq=[(b.layer,e,b.token) for b in t.batches for e in b.unique]
    cnt=Counter((l,e) for l,e,_ in seq)
    N=len(seq)
    items=sorted(cnt.items(), key=lambda kv: -(kv[1]-1)/eb[kv[0][0]])
    for B in (1000,2000,3000,4000):
        used=0; hits=0
        for k,c in items:
            if used+eb[k[0]]>B*MIB: continue
            used+=eb[k[0]]; hits+=c-1
        print(name,B,'static-oracle hit%',round(100*hits/N,1), 'N',N, 'distinct',len(cnt))
