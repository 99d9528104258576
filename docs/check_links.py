"""Checks that the relative links and the file paths named in the user documents exist.

    python docs/check_links.py            (exit status 1 and a list when one is missing)

Markdown links must resolve from the document's folder. A path in backticks (a word with a
slash or a known file suffix) must resolve from the document's folder, the repository root, or
one of the folders the documents name paths from (benchmarks/results/ for result files, the
package and its op folders for modules, benchmarks/ for the runners); a word without a suffix is
a path only when it ends in a slash. The "Pruned" section of a document names removed files.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", "docs/*.md", "benchmarks/results/README.md"]
BASES = ["", "scripts", "tiledispatch/core", "benchmarks", "benchmarks/results", "benchmarks/suites", "benchmarks/studies", "examples",
         "tiledispatch", "tiledispatch/ops/gemm", "tiledispatch/ops/attention", "tiledispatch/ops/conv",
         "tiledispatch/ops/attention/kernels", "tiledispatch/ops/conv/kernels", "tiledispatch/ops/gemm/kernels"]
SUFFIXES = (".py", ".md", ".json", ".csv", ".txt", ".png", ".log", ".jsonl", ".sh")
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE = re.compile(r"`([^`\s]+)`")
UNCHECKED = re.compile(r"^## Pruned\n.*?(?=^## |\Z)", re.M | re.S)  # files named because git alone keeps them
PLACEHOLDER = re.compile(r"[<>*]|\.\.\.|DIR|FILE|NN_|^\$|<op>|<gpu>")


def candidates(token: str) -> bool:
    """A backtick token that names a path in the tree (not a command, an option or a placeholder)."""
    token = token.split("#")[0]
    if PLACEHOLDER.search(token) or token.startswith(("-", "~", "http", "..")) or "=" in token:
        return False
    return token.endswith(SUFFIXES) or (token.endswith("/") and not token.startswith("/"))


def resolves(doc: Path, token: str) -> bool:
    token = token.split("#")[0].rstrip(".,;:")
    if (doc.parent / token).exists():
        return True
    return any((ROOT / base / token).exists() for base in BASES)


def missing(doc: Path) -> list[str]:
    text = UNCHECKED.sub("", doc.read_text())
    bad = [f"link {target}" for target in LINK.findall(text)
           if not target.startswith(("http://", "https://", "mailto:")) and not (doc.parent / target).exists()]
    bad += [f"path {token}" for token in CODE.findall(text) if candidates(token) and not resolves(doc, token)]
    return bad


def main() -> int:
    failures = 0
    for pattern in DOCUMENTS:
        for doc in sorted(ROOT.glob(pattern)):
            for problem in missing(doc):
                print(f"{doc.relative_to(ROOT)}: {problem}")
                failures += 1
    print(f"{failures} missing")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
