#!/bin/sh
# test_layers — libcore's layering (libcore/LAYERS, the one place the folder order is
# written). Fails, naming the file and line, when
#   - a libcore file includes a header of a folder listed after its own;
#   - an include of a libcore header names no folder ("util.h", "../decode.h"), in
#     libcore, tools/ or tests/; or a libcore file lies outside a listed folder;
#   - headers include each other in a cycle, or two modules do (a module is x.c with
#     x.h; a.c including b.h while b.c or b.h includes a.h is a cycle); a header with
#     no .c of its own (tokenizer_impl.h) is the private header of the module it serves,
#     so it never closes a cycle by itself;
#   - folders include each other in a cycle;
#   - kernels/ includes a libcore header;
#   - an object in $BUILD/obj/libcore/F/ uses a symbol defined in a folder above F (what
#     an extern declaration could hide from the include check; skipped without objects);
#   - only model/ (and train/) reach the kernels: a libcore file elsewhere or a tool
#     that includes kernels' backend.h or device.h, or whose object (libcore's in
#     $BUILD/obj, the tools' compiled here) references a kernel symbol (k_*, or one the
#     kernels' objects define). decode/'s remaining calls (k_argmax ...) are printed as
#     SKIP lines until its conversion lands; everywhere else they fail.
# Then it proves it can fail: on a copy of the tree with an upward include, flat
# includes, a header cycle, a module cycle, a folder cycle, a stray file, an upward
# symbol, kernel includes and kernel calls outside model/, every one must be caught
# (LAYERS_DEBUG=1 prints what each case reported).
. tests/lib.sh

python3 - "$TMP" <<'EOF'
import os, re, shutil, subprocess, sys

TMP = sys.argv[1]
BUILD = os.environ.get('BUILD', 'build')
INC = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SRC = ('.c', '.h')
KERNEL_USERS = ('model', 'train')  # the folders that may call kernels (issue 22 point 5)
KERNEL_HDRS = ('backend.h', 'device.h')


def read_layers(root):
    order = []
    for line in open(os.path.join(root, 'libcore/LAYERS')):
        w = line.split('#', 1)[0].split()
        if w: order.append(w[0])
    return order


def files_under(root, top, exts):
    out = []
    for d, subdirs, fs in os.walk(os.path.join(root, top)):
        subdirs.sort()
        for f in sorted(fs):
            if f.endswith(exts): out.append(os.path.relpath(os.path.join(d, f), root))
    return out


def sccs(nodes, edges):
    """strongly connected components (Tarjan), each as a sorted list"""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v: break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index: visit(v)
    return out


def nm_symbols(o):
    """(defined, undefined) symbol names of an object"""
    r = subprocess.run(['nm', o], capture_output=True, text=True)
    defs, uses = set(), set()
    for l in r.stdout.splitlines():
        w = l.split()
        if len(w) == 3 and w[1] in 'TDBRGSVWC': defs.add(w[2])
        elif len(w) == 2 and w[0] == 'U': uses.add(w[1])
    return defs, uses


def check_tree(root, objdir=None, tool_objs=None):
    """(passed, failures): failures are 'path:line: what' lines. tool_objs: {tools/x.c: its object}"""
    fails, passed = [], 0
    order = read_layers(root)
    rank = {f: i for i, f in enumerate(order)}
    chain = ' < '.join(order)
    exists = lambda p: os.path.isfile(os.path.join(root, p))
    lib = files_under(root, 'libcore', SRC)
    hdr_by_base = {}
    for p in lib:
        if p.endswith('.h'): hdr_by_base.setdefault(os.path.basename(p), []).append(p[len('libcore/'):])

    def folder_of(p):  # libcore/F/... -> F
        parts = p.split('/')
        return parts[1] if len(parts) > 2 else None

    def flat_hint(name):
        c = hdr_by_base.get(os.path.basename(name))
        return ' (write "%s")' % c[0] if c else ''

    file_edges, where = {}, {}  # file -> headers it includes; (a, b) -> 'path:line'
    for p in lib:
        f = folder_of(p)
        if f is None:
            fails.append('%s: lies in libcore/ itself, in no folder of libcore/LAYERS' % p)
            continue
        if f not in rank:
            fails.append('%s: folder %s/ is not in libcore/LAYERS (%s)' % (p, f, chain))
            continue
        ok = True
        for ln, line in enumerate(open(os.path.join(root, p), errors='replace'), 1):
            m = INC.match(line)
            if not m: continue
            name, at = m.group(1), '%s:%d' % (p, ln)
            g = name.split('/')[0] if '/' in name else None
            if g in rank and exists('libcore/' + name) and not name.endswith('.c'):
                if rank[g] > rank[f]:
                    fails.append('%s: includes "%s": %s/ is above %s/ (libcore/LAYERS: %s)' % (at, name, g, f, chain))
                    ok = False
                h = 'libcore/' + name
                file_edges.setdefault(p, set()).add(h)
                where.setdefault((p, h), at)
            elif '/' not in name and exists('kernels/' + name):
                # the device interface keeps its own -Ikernels name; model/ (and train/) alone use it
                if name in KERNEL_HDRS and f not in KERNEL_USERS:
                    fails.append('%s: includes "%s": only model/ (and train/) call kernels' % (at, name))
                    ok = False
            elif g in rank and name.endswith('.c'):
                fails.append('%s: includes a .c file "%s"' % (at, name))
                ok = False
            elif g in rank:
                fails.append('%s: includes "%s": there is no libcore/%s' % (at, name, name))
                ok = False
            else:
                fails.append('%s: include "%s" names no libcore folder%s' % (at, name, flat_hint(name)))
                ok = False
        passed += ok

    # tools/ and tests/: their own headers (the file's directory, and tests/ through
    # -Itests) and kernels' stay as they are; a libcore header is named with its folder
    for p in files_under(root, 'tools', SRC) + files_under(root, 'tests', SRC):
        ok = True
        dirs = [os.path.dirname(p)] + (['tests'] if p.startswith('tests/') else [])
        for ln, line in enumerate(open(os.path.join(root, p), errors='replace'), 1):
            m = INC.match(line)
            if not m: continue
            name, at = m.group(1), '%s:%d' % (p, ln)
            local = any(exists(os.path.normpath(os.path.join(d, name))) and
                        not os.path.normpath(os.path.join(d, name)).startswith('libcore/') for d in dirs)
            g = name.split('/')[0] if '/' in name else None
            if p.startswith('tools/') and name in KERNEL_HDRS and exists('kernels/' + name):
                fails.append('%s: includes "%s": a tool calls kernels through model/, never directly' % (at, name))
                ok = False
                continue
            if local or exists('kernels/' + name):
                continue
            if g in rank and exists('libcore/' + name):
                continue
            fails.append('%s: include "%s" names no libcore folder%s' % (at, name, flat_hint(name)))
            ok = False
        passed += ok

    # kernels/ sees nothing of libcore
    ok = True
    for p in files_under(root, 'kernels', SRC + ('.cu', '.cuh')):
        for ln, line in enumerate(open(os.path.join(root, p), errors='replace'), 1):
            m = INC.match(line)
            if not m: continue
            name = m.group(1)
            here = os.path.normpath(os.path.join(os.path.dirname(p), name))
            if not exists(here) and not exists('kernels/' + name) and (exists('libcore/' + name) or os.path.basename(name) in hdr_by_base):
                fails.append('%s:%d: kernels/ includes the libcore header "%s"' % (p, ln, name))
                ok = False
    passed += ok

    # a cycle is told as one path round it, each step with the include that makes it
    def report(kind, comp, edges, name, step_at):
        inside, path, prev = set(comp), None, {comp[0]: None}
        todo = [comp[0]]
        while todo and path is None:  # breadth first, back to comp[0]
            v = todo.pop(0)
            for w in sorted(edges.get(v, ())):
                if w == comp[0]:
                    path = [w]
                    while v is not None: path.append(v); v = prev[v]
                    path.reverse()
                    break
                if w in inside and w not in prev:
                    prev[w] = v
                    todo.append(w)
        steps = ['%s → %s (%s)' % (name(x), name(y), step_at(x, y)) for x, y in zip(path, path[1:])]
        fails.append('%s: include cycle between %s: %s' % (step_at(path[0], path[1]), kind, '; '.join(steps)))

    first_at = lambda key: lambda x, y: min(where[(a, h)] for (a, h) in where if key(a) == x and key(h) == y)

    # cycles between headers
    nodes = set(file_edges) | {h for hs in file_edges.values() for h in hs}
    hdr_edges = {a: bs for a, bs in file_edges.items() if a.endswith('.h')}
    ok = True
    for comp in sccs(nodes, hdr_edges):
        if len(comp) > 1:
            report('headers', comp, hdr_edges, lambda x: x[len('libcore/'):], first_at(lambda p: p))
            ok = False
    passed += ok

    # cycles between modules (x.c + x.h)
    mod = lambda p: p.rsplit('.', 1)[0]
    implemented = {mod(p) for p in lib if p.endswith('.c')}
    mod_edges = {}
    for a, hs in file_edges.items():
        for h in hs:
            if mod(h) != mod(a): mod_edges.setdefault(mod(a), set()).add(mod(h))
    ok = True
    for comp in sccs({mod(p) for p in nodes}, mod_edges):
        if sum(c in implemented for c in comp) > 1:
            report('modules', comp, mod_edges, lambda x: x[len('libcore/'):], first_at(mod))
            ok = False
    passed += ok

    # cycles between folders
    fold_edges = {}
    for a, hs in file_edges.items():
        for h in hs:
            if folder_of(a) != folder_of(h): fold_edges.setdefault(folder_of(a), set()).add(folder_of(h))
    ok = True
    for comp in sccs(set(rank), fold_edges):
        if len(comp) > 1:
            report('folders', comp, fold_edges, lambda x: x + '/', first_at(folder_of))
            ok = False
    passed += ok

    # symbols: what each object uses is defined in its folder or below
    if objdir:
        defs, uses = {}, []
        for p in lib:
            if not p.endswith('.c') or folder_of(p) not in rank: continue
            o = os.path.join(objdir, p[:-2] + '.o')
            if not os.path.isfile(o): continue
            r = subprocess.run(['nm', o], capture_output=True, text=True)
            for l in r.stdout.splitlines():
                w = l.split()
                if len(w) == 3 and w[1] in 'TDBRGSVWC': defs.setdefault(w[2], p)
                elif len(w) == 2 and w[0] == 'U': uses.append((p, w[1]))
        ok = True
        for p, s in uses:
            d = defs.get(s)
            if d and rank[folder_of(d)] > rank[folder_of(p)]:
                fails.append('%s: uses %s, defined in %s: %s/ is above %s/' % (p, s, d, folder_of(d), folder_of(p)))
                ok = False
        passed += ok

    # kernel symbols: referenced only from model/ and train/ (and tests)
    if objdir or tool_objs:
        kern = set()
        for d, _, fs in os.walk(os.path.join(objdir, 'kernels')) if objdir else ():
            for f in fs:
                if f.endswith('.o'): kern |= nm_symbols(os.path.join(d, f))[0]
        is_kernel = lambda s: s.startswith('k_') or s in kern
        objs = []
        for p in lib if objdir else ():
            o = os.path.join(objdir, p[:-2] + '.o')
            if p.endswith('.c') and folder_of(p) in rank and folder_of(p) not in KERNEL_USERS and os.path.isfile(o):
                objs.append((p, o))
        objs += sorted((tool_objs or {}).items())
        ok = True
        for p, o in objs:
            calls = sorted(s for s in nm_symbols(o)[1] if is_kernel(s))
            if not calls: continue
            fails.append('%s: calls the kernels %s: only model/ (and train/) call kernels' % (p, ' '.join(calls)))
            ok = False
        passed += ok
    return passed, fails


# ---- the tree itself ----
objdir = os.path.join(BUILD, 'obj')
has_objs = os.path.isdir(os.path.join(objdir, 'libcore')) and shutil.which('nm')
if not has_objs:
    print('SKIP test_layers: symbols: no objects in %s/obj/libcore (run make first)' % BUILD)

def compile_objs(root, sources, out):  # {source: object}, compiled into out (for nm)
    objs = {}
    for s in sources:
        o = os.path.join(out, s[:-2] + '.o')
        os.makedirs(os.path.dirname(o), exist_ok=True)
        r = subprocess.run([os.environ.get('CC', 'cc'), '-std=c11', '-O0', '-w', '-D_GNU_SOURCE', '-I' + os.path.join(root, 'libcore'),
                            '-I' + os.path.join(root, 'kernels'), '-c', os.path.join(root, s), '-o', o], capture_output=True, text=True)
        if r.returncode: return None, '%s: does not compile: %s' % (s, r.stderr.strip().splitlines()[-1:] or '?')
        objs[s] = o
    return objs, None


tool_objs = None
if shutil.which('nm'):
    tool_objs, why = compile_objs('.', files_under('.', 'tools', ('.c',)), os.path.join(TMP, 'toolobj'))
    if why: print('SKIP test_layers: tools\' kernel symbols: ' + why)
passed, fails = check_tree('.', objdir if has_objs else None, tool_objs)
for f in fails: print('FAIL: ' + f)

# ---- it can fail: each defect on its own copy of the tree must be caught ----
def fresh_copy(n):
    copy = os.path.join(TMP, 'tree%d' % n)
    keep = SRC + ('.cu', '.cuh')
    for top in ('libcore', 'tools', 'tests', 'kernels'):
        shutil.copytree(top, os.path.join(copy, top),
                        ignore=lambda d, fs: [f for f in fs if os.path.isfile(os.path.join(d, f)) and not (f.endswith(keep) or f == 'LAYERS')])
    return copy


def append(copy, rel, text):
    os.makedirs(os.path.dirname(os.path.join(copy, rel)), exist_ok=True)
    with open(os.path.join(copy, rel), 'a') as f: f.write(text)
    return sum(1 for _ in open(os.path.join(copy, rel)))  # the line just written


def line_of(copy, rel, header):  # the line where rel includes header (an edge the tree has)
    for n, line in enumerate(open(os.path.join(copy, rel)), 1):
        if line.startswith('#include "%s"' % header): return n
    return 0


def objects(copy, *sources):  # compiled into copy/obj, for the symbol check
    for s in sources:
        o = os.path.join(copy, 'obj', s[:-2] + '.o')
        os.makedirs(os.path.dirname(o), exist_ok=True)
        subprocess.run([os.environ.get('CC', 'cc'), '-c', os.path.join(copy, s), '-o', o], check=True)
    return os.path.join(copy, 'obj')


def upward(c):
    return 'libcore/base/util.c:%d: includes "model/model.h": model/ is above base/' % append(c, 'libcore/base/util.c', '#include "model/model.h"\n')


def flat_lib(c):
    return 'libcore/model/sampler.c:%d: include "util.h" names no libcore folder (write "base/util.h")' % append(c, 'libcore/model/sampler.c', '#include "util.h"\n')


def flat_tool(c):
    return 'tools/decode.c:%d: include "forward.h" names no libcore folder (write "model/forward.h")' % append(c, 'tools/decode.c', '#include "forward.h"\n')


def flat_test(c):
    return 'tests/fuzz/targets.c:%d: include "gguf.h" names no libcore folder' % append(c, 'tests/fuzz/targets.c', '#include "gguf.h"\n')


def relative(c):
    return 'libcore/decode/standard.c:%d: include "../decode/drafter.h" names no libcore folder' % append(c, 'libcore/decode/standard.c', '#include "../decode/drafter.h"\n')


def header_cycle(c):  # model/forward.h includes model/kvcache.h
    n = append(c, 'libcore/model/kvcache.h', '#include "model/forward.h"\n')
    return 'include cycle between headers: model/forward.h → model/kvcache.h (libcore/model/forward.h:%d); model/kvcache.h → model/forward.h (libcore/model/kvcache.h:%d)' % (line_of(c, 'libcore/model/forward.h', 'model/kvcache.h'), n)


def module_cycle(c):  # one folder, no header includes the other: a .c each way
    n1 = append(c, 'libcore/formats/tensorfile.c', '#include "formats/gguf.h"\n')
    n2 = append(c, 'libcore/formats/gguf.c', '#include "formats/tensorfile.h"\n')
    return 'include cycle between modules: formats/gguf → formats/tensorfile (libcore/formats/gguf.c:%d); formats/tensorfile → formats/gguf (libcore/formats/tensorfile.c:%d)' % (n2, n1)


def folder_cycle(c):  # decode/method.h includes heads/medusa_heads.h (the edge the search reports)
    n = append(c, 'libcore/heads/bundle.c', '#include "decode/engine.h"\n')
    return 'include cycle between folders: decode/ → heads/ (libcore/decode/method.h:%d); heads/ → decode/ (libcore/heads/bundle.c:%d)' % (line_of(c, 'libcore/decode/method.h', 'heads/medusa_heads.h'), n)


def kernels_up(c):
    return 'kernels/backend.h:%d: kernels/ includes the libcore header "model/model.h"' % append(c, 'kernels/backend.h', '#include "model/model.h"\n')


def stray(c):
    append(c, 'libcore/stray.c', 'int stray;\n')
    return 'libcore/stray.c: lies in libcore/ itself'


def unlisted(c):
    append(c, 'libcore/extra/x.c', 'int x;\n')
    return 'libcore/extra/x.c: folder extra/ is not in libcore/LAYERS'


def symbol(c):  # base/ calls into model/ through an extern: no include shows it
    append(c, 'libcore/base/sym_low.c', 'int sym_high(void);\nint sym_low(void) { return sym_high(); }\n')
    append(c, 'libcore/model/sym_high.c', 'int sym_high(void) { return 1; }\n')
    return 'libcore/base/sym_low.c: uses sym_high, defined in libcore/model/sym_high.c: model/ is above base/'


def kernel_include_lib(c):
    return 'libcore/heads/bundle.c:%d: includes "backend.h": only model/ (and train/) call kernels' % append(c, 'libcore/heads/bundle.c', '#include "backend.h"\n')


def kernel_include_tool(c):
    return 'tools/decode.c:%d: includes "device.h": a tool calls kernels through model/' % append(c, 'tools/decode.c', '#include "device.h"\n')


def kernel_call_lib(c):  # an extern declaration: no include shows it
    append(c, 'libcore/heads/kcall.c', 'void k_matmul(void);\nvoid heads_kcall(void) { k_matmul(); }\n')
    return 'libcore/heads/kcall.c: calls the kernels k_matmul: only model/'


def kernel_call_tool(c):
    append(c, 'tools/kcall.c', 'int k_init(int);\nint main(void) { return k_init(1); }\n')
    return 'tools/kcall.c: calls the kernels k_init: only model/'


def kernel_call_model(c):  # model/ may: nothing reported (the case's text is found in no line)
    append(c, 'libcore/model/kcall.c', 'void k_matmul(void);\nvoid model_kcall(void) { k_matmul(); }\n')
    return None


def kernel_call_decode(c):  # a method reads ids and probabilities through model/
    append(c, 'libcore/decode/kcall.c', 'int k_argmax(void);\nint decode_kcall(void) { return k_argmax(); }\n')
    return 'libcore/decode/kcall.c: calls the kernels k_argmax: only model/'


cases = [('an upward include', upward), ('a flat include in libcore', flat_lib), ('a flat include in a tool', flat_tool),
         ('a flat include in a fuzz target', flat_test), ('a relative include', relative), ('a header cycle', header_cycle),
         ('a module cycle', module_cycle), ('a folder cycle', folder_cycle), ('kernels/ including libcore', kernels_up),
         ('a file outside the folders', stray), ('a folder not in LAYERS', unlisted), ('an upward symbol', symbol),
         ('backend.h included in heads/', kernel_include_lib), ('device.h included in a tool', kernel_include_tool),
         ('a kernel called from heads/', kernel_call_lib), ('a kernel called from a tool', kernel_call_tool),
         ('a kernel called from model/ (allowed)', kernel_call_model),
         ('a kernel called from decode/', kernel_call_decode)]
compiled = {symbol: ('libcore/base/sym_low.c', 'libcore/model/sym_high.c'), kernel_call_lib: ('libcore/heads/kcall.c',),
            kernel_call_model: ('libcore/model/kcall.c',), kernel_call_decode: ('libcore/decode/kcall.c',)}
for n, (what, make) in enumerate(cases):
    copy = fresh_copy(n)
    text = make(copy)
    obj = objects(copy, *compiled[make]) if make in compiled else None
    tobj = compile_objs(copy, ['tools/kcall.c'], os.path.join(copy, 'toolobj'))[0] if make is kernel_call_tool else None
    _, bad = check_tree(copy, obj, tobj)
    if os.environ.get('LAYERS_DEBUG'): print('%s:\n  %s' % (what, '\n  '.join(bad)))
    if text is None:  # an allowed case: it must add no failure about kernels
        if not any('kernel' in b for b in bad): passed += 1
        else:
            fails.append('self-test: %s was reported' % what)
            print('FAIL: self-test: %s was reported: %s' % (what, bad))
    elif any(text in b for b in bad): passed += 1
    else:
        fails.append('self-test: %s was not caught' % what)
        print('FAIL: self-test: %s was not caught (no line with: %s; got: %s)' % (what, text, bad))

print('layers: %d passed, %d failed' % (passed, len(fails)))
sys.exit(1 if fails else 0)
EOF
