import sys, math; sys.path[:0] = [str(__import__('pathlib').Path(__file__).resolve().parents[2]), str(__import__('pathlib').Path(__file__).resolve().parent)]
import numpy as np
from common import tr, MIB
from harness.engine.policies import Policy
from harness.engine.policies.heaps import LazyMinHeap as _LazyMinHeap
from harness.replay.simulate import replay

def usage(t):
    n=t.n_layer; E=t.n_expert
    U=np.zeros((n,t.decode_tokens,E),bool); P=np.zeros((n,E))
    for b in t.batches:
        if b.token<0:
            for e in b.experts: P[b.layer,e]+=1
        else:
            U[b.layer,b.token,list(b.unique)]=True
    return U,P

class ScorePolicy(Policy):
    name='score'
    def __init__(self, fn, t, phase=1.0):
        self.fn=fn; self.t=t; self.phase=phase
    def bind(self, budget, eb):
        n=self.n=len(eb); self.budget=budget; self.eb=eb
        self.slots=budget/sum(eb)
        self.tok=[0]*n; self.res=[set() for _ in range(n)]
        self.heaps=[_LazyMinHeap() for _ in range(n)]; self.head=[None]*n; self.dirty=set()
        self.open=-1; self.batch=[]; self.cur=0; self.tie=0; self.score=[None]*n; self.prefill=False
        self.ctx={}
    def on_batch(self, layer, now):
        self._close(); self.cur=layer; self.open=layer; self.batch=[]; self.prefill=False
    def _close(self):
        L=self.open
        if L<0 or not self.batch: self.open=-1; return
        self.open=-1
        if not self.prefill_batch: self.tok[L]+=1
        s=self.fn(self, L, self.tok[L], self.batch, self.prefill_batch)
        self.score[L]=s
        h=self.heaps[L]
        for e in self.res[L]:
            self.tie+=1; h.set((L,e), float(s[e]), self.tie)
        self.dirty.add(L)
    def on_hit(self,key,now):
        if key[0]==self.open: self.batch.append(key[1])
    def on_insert(self,key,now):
        self.res[key[0]].add(key[1]); self.on_hit(key,now)
    def on_promote(self,key,now): pass
    def on_evict(self,key):
        self.res[key[0]].discard(key[1]); self.heaps[key[0]].discard(key); self.dirty.add(key[0])
    def victim(self, protected):
        if self.open>=0: self._close()
        n,cur,head=self.n,self.cur,self.head
        if self.dirty:
            for L in self.dirty: head[L]=self.heaps[L].peek(set())
            self.dirty.clear()
        best=None; bs=-math.inf
        for L,top in enumerate(head):
            if L==cur: top=self.heaps[L].peek(protected)
            if top is None: continue
            s=self.phase*((L-cur)%n or n)/n - top[0]
            if s>bs: bs,best=s,top[1]
        return best

def run(fn, name='qwen', budgets=(2000,3000,4000), phase=1.0, **kw):
    t=tr[name]
    # mark prefill batches: patch via trace batches order
    out=[]
    for B in budgets:
        p=ScorePolicy(fn,t,phase); p.kw=kw
        # know which batches are prefill: wrap on_batch
        it=iter(t.batches)
        ob=p.on_batch
        def on_batch(layer,now,_it=it,_ob=ob,_p=p):
            b=next(_it); _ob(layer,now); _p.prefill_batch=b.token<0
        p.on_batch=on_batch
        r=replay(t,p,B*MIB)
        l=LRU_[name][B]; o=BEL_[name][B]
        out.append((B, round(r.hit_pct,1), round(100*(r.hit_pct-l)/(o-l))))
    return out

LRU_={}; BEL_={}
for nm in tr:
    LRU_[nm]={}; BEL_[nm]={}
    for B in (500,1000,1500,2000,3000,4000,6000,8000):
        LRU_[nm][B]=replay(tr[nm],'lru',B*MIB).hit_pct; BEL_[nm][B]=replay(tr[nm],'belady',B*MIB).hit_pct
USE={nm:usage(tr[nm]) for nm in tr}
