import csv, glob, statistics, sys, collections
# per point: median over rounds of each run's median time; speed-up = before / after
res = collections.defaultdict(lambda: {"before": [], "after": []})
for f in glob.glob('/tmp/reg/*_*_[0-9]/results.csv'):
    v = 'before' if '_before_' in f else 'after'
    for r in csv.DictReader(open(f)):
        if r['status'] != 'ok': continue
        key = (r['id'], r['isa'])
        res[key][v].append(float(r['time_median_s']))
rows = []
for (pid, isa), d in sorted(res.items()):
    if not d['before'] or not d['after']: continue
    b, a = statistics.median(d['before']), statistics.median(d['after'])
    rows.append((b / a, pid, isa, b, a, len(d['before']), len(d['after'])))
for s, pid, isa, b, a, nb, na in sorted(rows):
    print(f"{s:6.3f}  {pid:60s} {isa:6s} before {b*1e3:9.2f} ms  after {a*1e3:9.2f} ms  ({nb}/{na} runs)")
