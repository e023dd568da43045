# parse.py reads the raw output of run.sh (its directory is the argument)
# and prints, per ratio, the median over rounds and the per-round values.
import sys
out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/idem-sidebyside"
import re,glob,statistics as st,collections
def metric(line,name):
    m=re.search(r'([\d.]+) '+re.escape(name)+r'(\s|$)',line); return float(m.group(1)) if m else None
res=collections.defaultdict(lambda: collections.defaultdict(list))
for t in ['base','main']:
    for f in sorted(glob.glob(f'{out}/{t}-[0-9]*.txt')):
        L=open(f).read().splitlines()
        def find(prefix,pat):
            for l in L:
                if l.startswith(prefix) and re.search(pat,l): return l
        R=res[t]
        for inf in ['1','32']:
            n=find('tmpfs',f'inflight={inf}/nethttp'); m=find('tmpfs',f'inflight={inf}/idem-memory'); b=find('tmpfs',f'inflight={inf}/idem-bbolt')
            R[f'tmpfs {inf} bbolt/nethttp'].append(metric(b,'req/s')/metric(n,'req/s'))
            R[f'tmpfs {inf} memory/nethttp'].append(metric(m,'req/s')/metric(n,'req/s'))
            R[f'tmpfs {inf} cpu-µs nethttp/memory/bbolt'].append((metric(n,'cpu-µs/op'),metric(m,'cpu-µs/op'),metric(b,'cpu-µs/op')))
            R[f'tmpfs {inf} allocs memory/bbolt'].append((metric(m,'allocs/op'),metric(b,'allocs/op')))
        m=find('disk','inflight=32/idem-memory'); b=find('disk','inflight=32/idem-bbolt'); n=find('disk','inflight=32/nethttp')
        R['disk 32 allocs nethttp/memory/bbolt'].append((metric(n,'allocs/op'),metric(m,'allocs/op'),metric(b,'allocs/op')))
        R['disk 32 bbolt/nethttp'].append(metric(b,'req/s')/metric(n,'req/s'))
        p=find('disk','BoltPut'); b1=find('disk','inflight=1/idem-bbolt')
        R['disk 1 bbolt/BoltPut'].append(metric(b1,'req/s')/metric(p,'ops/s'))
        R['disk 1 BoltPut ops/s, bbolt req/s'].append((metric(p,'ops/s'),metric(b1,'req/s')))
        for pre in ['disk','tmpfs']:
            s=find(pre,'store=bolt/inflight=32')
            R[f'srv {pre} bolt mw/bare, mw/bare-cpu'].append((metric(s,'mw/bare'),metric(s,'mw/bare-cpu')))
            R[f'srv {pre} bolt allocs'].append(metric(s,'allocs/op'))
        s=find('disk','store=memory/inflight=32')
        R['srv memory mw/bare, mw/bare-cpu'].append((metric(s,'mw/bare'),metric(s,'mw/bare-cpu')))
keys=list(res['main'].keys())
def fmt(v):
    if isinstance(v[0],tuple):
        med=tuple(round(st.median(x),2) for x in zip(*v)); return f"{med} per-round {[tuple(round(y,2) for y in x) for x in v]}"
    return f"{st.median(v):.2f} ({' '.join(f'{x:.2f}' for x in v)})"
for k in keys:
    print(f"{k:40s} | base {fmt(res['base'][k])} | main {fmt(res['main'][k])}")
