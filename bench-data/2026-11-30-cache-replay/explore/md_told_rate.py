from scorepolicy import *
class St: pass
def md(qmode='online', W=(-3,2,-0.5,1,1), age=0.0, m=4.0, fut=None):
    def f(p,L,t,batch,pre):
        U,P=USE[p.t.name]; nL,T,E=U.shape
        if not hasattr(p,'st'):
            p.st=St(); p.st.tr=np.zeros((nL,E,E)); p.st.src=np.zeros((nL,E)); p.st.prev=[None]*nL
        st=p.st
        npre=p.t.prefill_tokens
        occ=P[L]+U[L,:t].sum(0); tok=npre+t
        if qmode=='online': q=(occ+0.5)/(tok+0.5*E/6)
        elif qmode=='oracle': q=(P[L]+U[L].sum(0)+0.5)/(npre+T+0.5*E/6)
        elif qmode=='oracle-rem':
            w=fut or 128; q=(U[L,t:t+w].sum(0)+0.5)/(min(T,t+w)-t+0.5*E/6+1e-9)
        last=np.full(E,-1e4)
        if t>0:
            used=U[L,:t]; anyu=used.any(0)
            lastidx=t-1-np.argmax(used[::-1],0)
            last[anyu]=lastidx[anyu]+npre
        last[(last<0)&(P[L]>0)]=npre-1
        since=np.minimum(tok-1-last,1e4)+1
        base=W[0]+W[2]*np.log2(1+np.minimum(since,63))+W[3]*np.log2(q)
        if not pre:
            base[batch]+=W[1]
            prev=st.prev[L]
            if prev is not None:
                st.tr[L][np.ix_(prev,batch)]+=1; st.src[L][prev]+=1
            st.prev[L]=list(batch)
        else:
            st.prev[L]=None
        prev=st.prev[L]
        if prev is not None and W[4]:
            pp=((st.tr[L][prev]+m*q)/(st.src[L][prev][:,None]+m)).mean(0)
            base=base+W[4]*np.log2(pp/q)
        return base-age*since
    return f
print('md-age0 online', run(md(), phase=1.0))
print('md-age0 oracle q', run(md('oracle'), phase=1.0))
for w in (16,32,64):
    print('md-age0 oracle remaining q',w, run(md('oracle-rem',fut=w), phase=1.0))
