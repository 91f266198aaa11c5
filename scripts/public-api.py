#!/usr/bin/env python3
"""Lists a crate's public API from its rustdoc HTML, one line per item, so a
change to the public surface is a visible diff of a committed file.

Why rustdoc HTML: `cargo public-api` needs nightly rustdoc JSON, and only the
stable toolchain is installed here. rustdoc's HTML is what users read; each
item page carries the declaration (`item-decl`, with public fields and
variants), one `code-header` per inherent method and one per trait impl
(its header only: the trait's methods follow from the trait). Auto-trait
and blanket impls (Send, Sync, From<T> for T, ...) are left out: they follow
from the rest and change with the compiler, not with us.

usage: public-api.py DOC_DIR CRATE   (e.g. target/doc ballast_xds)
"""
import html
import os
import re
import sys

doc, crate = sys.argv[1], sys.argv[2]
root = os.path.join(doc, crate)
index = open(os.path.join(root, "all.html"), encoding="utf-8").read()
pages = sorted(set(re.findall(r'<li><a href="([^"]+\.html)">', index)))

def text(fragment):
    t = re.sub(r"<[^>]+>", "", fragment)
    return re.sub(r"\s+", " ", html.unescape(t)).strip()

out = []
for page in pages:
    s = open(os.path.join(root, page), encoding="utf-8").read()
    kind, name = os.path.basename(page)[:-5].split(".", 1)
    path = crate + "::" + "::".join(os.path.dirname(page).split(os.sep) + [name]).strip(":")
    path = path.replace("::::", "::")
    for cut in ('id="synthetic-implementations"', 'id="blanket-implementations"'):
        if cut in s:
            s = s[: s.index(cut)]
    decl = re.search(r'<pre class="rust item-decl">(.*?)</pre>', s, re.S)
    out.append(f"{kind} {path}: {text(decl.group(1)) if decl else ''}".rstrip(": "))
    inherent, _, traits = s.partition('id="trait-implementations"')
    for h in re.findall(r'<h4 class="code-header">(.*?)</h4>', inherent, re.S):
        out.append(f"    {path}: {text(h)}")
    for h in re.findall(r'<h3 class="code-header">(.*?)</h3>', traits, re.S):
        out.append(f"    {path}: {text(h)}")
print("\n".join(out))
