"""Per-instruction attribution of the forward's unmasked-loop far-tile path, from its SASS
(results/kernel-h200/offline-census-9.md). A development tool: a rule-based def-use tagging whose
rules are listed in that file, not a general SASS analyser.

    PYTHONPATH=src python3 -m lab.kernels.fwd_loop_census --head-dim 64 --sass-dir /tmp/census9
    python3 lab/kernels/fwd_far_attribution.py /tmp/census9/fwd_D64_64x64-4-2-r168.sass [list]

prints the group counts (per iteration and per score, 32 scores a thread for a 64x64 tile of 4
warps) and, with `list`, every instruction with its tag.
"""
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]
from lab.kernels.fwd_loop_census import loops  # noqa: E402
from lab.kernels.kernel_report import sass_instructions  # noqa: E402

ins = sass_instructions(open(sys.argv[1]).read())
loop = loops(ins)[0]                       # loop 1: unmasked tiles
body = [i for i in ins if loop['start'] <= i['addr'] <= loop['end']]
(a_lo, a_hi), (b_lo, b_hi) = loop['arms']
arm1 = [i for i in body if a_lo <= i['addr'] <= a_hi]; arm2 = [i for i in body if b_lo <= i['addr'] <= b_hi]
far, near = (arm1, arm2) if sum('.LG2' in i['mods'] for i in arm1) < sum('.LG2' in i['mods'] for i in arm2) else (arm2, arm1)
near_addrs = {i['addr'] for i in near}; far_addrs = {i['addr'] for i in far}
path = [i for i in body if i['addr'] not in near_addrs]
branch_at = min(far_addrs | near_addrs) - 0x10   # the far/near BRA; what precedes it is the prelude
NO_DST = {'LDGSTS', 'STS', 'STG', 'BRA', 'BAR', 'DEPBAR', 'LDGDEPBAR', 'WARPGROUP', 'STL', 'NOP'}
def regs(tok, width=1):
    m = re.search(r'\b(U?R|U?P)(\d+)(\.64)?', tok)
    if not m or m.group(1) in ('RZ',): return []
    w = 2 if m.group(3) else width
    return [f"{m.group(1)}{int(m.group(2)) + k}" for k in range(w)]
for n, i in enumerate(path):
    ops = [o.strip() for o in i['args'].split(',')] if i['args'] else []
    op = i['op']; full = op + i['mods']
    dst, src = [], []
    if op in NO_DST: src = ops
    elif op == 'SHFL': dst, src = ops[1:2], ops[2:]
    elif op in ('FSETP', 'ISETP', 'UISETP', 'PLOP3') or (len(ops) > 1 and re.fullmatch(r'U?P\d', ops[1])):
        dst, src = ops[:2], ops[2:]
    else: dst, src = ops[:1], ops[1:]
    if i['pred']: src = src + [i['pred'].lstrip('@!')]
    w = 32 if op == 'HGMMA' else (2 if '.WIDE' in i['mods'] or '.64' in i['mods'] else 1)
    i['dst'] = [r for t in dst for r in regs(t, w) if not r.endswith('RZ')]
    s = []
    for t in src:
        if t.startswith('gdesc'): s += regs(t, 4)
        else: s += re.findall(r'\b(U?R\d+|U?P\d)\b', t) if '[' in t else regs(t, 4 if op == 'HGMMA' else (2 if '.64' in i['mods'] or ('.WIDE' in i['mods'] and t is src[-1]) else 1))
    if op == 'HGMMA' and not ops[-1].startswith('!UPT') and 'RZ' not in ops[2:3]: s += i['dst']
    i['src'] = s; i['n'] = n
# def-use, cyclic (values read before their def in the path come from the previous iteration)
last = {}
for i in path * 2:
    i.setdefault('prod', set())
    if i is path[0] and last: pass
    for r in i['src']:
        if r in last: i['prod'].add(last[r])
    for r in i['dst']: last[r] = i['n']
cons = collections.defaultdict(set)
for i in path:
    for p in i['prod']: cons[p].add(i['n'])
P = {i['n']: i for i in path}
ramp = set()  # loop-invariant column-ramp registers: read in the far arm, never written in the loop
written = {r for i in path for r in i['dst']}
ramp_regs = {r for i in path if i['op'] + i['mods'] == 'I2FP.F32.U32' for r in i['dst']}
def is_col(r): return re.fullmatch(r'R\d+', r) and (r not in written or r in ramp_regs)
def producers(i, op=None): return [P[p] for p in i['prod'] if op is None or P[p]['op'] == op]
tag = {}
hg = [i for i in path if i['op'] == 'HGMMA']
for i in path:
    n, op, full, a = i['n'], i['op'], i['op'] + i['mods'], i['args']
    if op in ('LDL', 'STL'): t = 'spill (LDL/STL)'
    elif op == 'HGMMA': t = 'PV matmul (HGMMA, WARPGROUP)' if 'tnspB' in a else 'QK matmuls (HGMMA, WARPGROUP)'
    elif op == 'WARPGROUP':
        nxt = next((h for h in hg if h['n'] > n), None)
        t = 'PV matmul (HGMMA, WARPGROUP)' if nxt is not None and 'tnspB' in nxt['args'] and '.ARRIVE' in i['mods'] else 'QK matmuls (HGMMA, WARPGROUP)'
    elif i['addr'] in far_addrs:
        if op == 'BRA': t = 'loop overhead (branches, counters, descriptors)'
        elif op == 'FMUL' and any(is_col(r) for r in i['src']) and not any(r.startswith('UR') for r in i['src']):
            t = 'series: column vector b (per column)'
        else: t = None
    elif full == 'MUFU.COS' or (full == 'FMUL.RZ' and '0.159' in a): t = 'cos (FMUL.RZ 1/2pi, MUFU.COS)'
    elif full == 'MUFU.EX2': t = 'softmax: exp2'
    elif op in ('FMNMX', 'SHFL'): t = 'softmax: row max / shuffles'
    elif op in ('F2FP', 'F2F'): t = 'conversion (F2FP pack to bf16)'
    elif op in ('LDGSTS', 'LDGDEPBAR', 'DEPBAR', 'BAR', 'LDS'): t = 'loads / barriers'
    elif op in ('BRA', 'PLOP3') : t = 'loop overhead (branches, counters, descriptors)'
    elif i['addr'] < branch_at and op[0] in 'FI' and op not in ('IADD3', 'IMAD'): t = 'tile scalars: bounds, far test, row offsets (prelude)'
    elif op == 'FMUL':
        srcops = {p['op'] + p['mods'] for p in producers(i)}
        if 'MUFU.COS' in srcops: t = 'amplitude x cos (FMUL)'
        elif 'MUFU.EX2' in srcops: t = 'softmax: acc rescale'
        elif any(p['op'] == 'HGMMA' for p in producers(i)): t = 'phase product phi*fs (FMUL)'
        else: t = 'softmax: row scalars (m, shift, l, -inf guard)'
    elif op == 'FFMA':
        t = 'softmax: p argument (FFMA)' if any(r.startswith('UR') for r in i['src']) else 'softmax: row scalars (m, shift, l, -inf guard)'
    elif op == 'FADD':
        t = 'softmax: row sums (FADD)' if any(p['op'] in ('MUFU', 'FADD', 'SHFL') and (p['op'] != 'MUFU' or '.EX2' in p['mods']) for p in producers(i)) and '-' not in a.split(',')[1] else 'softmax: row scalars (m, shift, l, -inf guard)'
    elif op in ('FSETP', 'FSEL'): t = 'softmax: row scalars (m, shift, l, -inf guard)'
    else: t = None
    tag[n] = t
# far arm: per-score series FFMAs (depend on the column vector / ramp) vs per-tile/per-row scalars
def dep_col(i, seen=None):
    if any(is_col(r) for r in i['src']) and i['op'] in ('FFMA', 'FMUL'): return True
    return any(tag.get(p) == 'series: column vector b (per column)' or (P[p]['addr'] in far_addrs and P[p]['n'] < i['n'] and dep_col(P[p])) for p in i['prod'])
for i in path:
    if i['addr'] in far_addrs and tag[i['n']] is None:
        tag[i['n']] = 'series: per-score FFMA' if i['op'] == 'FFMA' and dep_col(i) else 'series: far-tile scalars (log2, rcp, exp2, row coefficients)'
# the rest (integer, moves, uniform, S2R): by what consumes them (backwards, to a fixed point)
for _ in range(20):
    for i in reversed(path):
        if tag[i['n']] is None:
            ts = [tag[c] for c in sorted(cons[i['n']]) if tag[c]]
            if ts:
                t = ts[0]
                if t.startswith('loads') or t.startswith('spill'): t = 'load addresses (IADD3/IMAD.WIDE/MOV/S2R/LOP3)'
                elif t.startswith('QK') or t.startswith('PV'): t = 'loop overhead (branches, counters, descriptors)'
                elif t.startswith('tile scalars') or t.startswith('series'): t = 'tile scalars: bounds, far test, row offsets (prelude)' if i['addr'] < branch_at else t
                elif t.startswith('softmax'): t = 'softmax: row scalars (m, shift, l, -inf guard)'
                tag[i['n']] = t
for i in path:
    if tag[i['n']] is None: tag[i['n']] = 'loop overhead (branches, counters, descriptors)' if i['op'].startswith('U') or i['op'] in ('MOV',) else 'unattributed'
counts = collections.Counter(tag.values()); ops = collections.defaultdict(collections.Counter)
for i in path: ops[tag[i['n']]][i['op'] + (i['mods'] if i['op'] in ('MUFU',) else '')] += 1
scores = 32
print(f"far-tile path of loop 1: {len(path)} instructions ({len(path)/scores:.2f} per score); far arm {len(far)}, near arm {len(near)}")
for t, c in sorted(counts.items(), key=lambda kv: -kv[1]):
    print(f"| {t} | {c} | {c/scores:.2f} | " + ", ".join(f"{o} {k}" for o, k in ops[t].most_common()) + " |")
if len(sys.argv) > 2:
    for i in path: print(f"{i['addr']:05x} {tag[i['n']][:28]:28s} {i['pred']} {i['op']}{i['mods']} {i['args']}")
