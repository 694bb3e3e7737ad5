"""A varied calibration corpus from what these machines carry, for distilling converted
language models (examples/hf/smollm2), with held-out text of every source and one held-out
domain that is in no part of the calibration: third-party Python packages' docstrings
(numpy's and scipy's; the evaluations of converted models draw on such text, so no
third-party package's source or docstring enters the calibration).

    corpus = build(tok, "runs/corpus")          # read, deduplicate, tokenise once, cache
    windows = corpus.calibration(1024, 1000)     # [1000, 1024]: packed, every source mixed
    ids = corpus.held_out("rust-books")          # 1-D ids: a source's held-out documents
    ids = corpus.held_out(OUT_OF_DOMAIN)         # the domain the calibration never saw

Sources (SOURCES: name, licence, style), each read as documents (a file, a page, a
docstring, a speech); a document goes to the held-out side when crc32(its id) % 10 == 0.
A source missing on a machine is skipped and said so (corpus.json lists what was used).

Deduplication: paragraphs (blank-line separated) of >= 40 characters are compared after
folding case and whitespace; a paragraph seen before, in any source, is dropped (licence
headers, pages installed twice, repeated boilerplate). Each source is capped at
`cap` tokens (default 1.5 M) so that no style dominates.

Tokenised once: the folder holds corpus.json (the sources, their licences, the files read,
documents, paragraphs dropped, tokens per side, the tokenizer's digest) and one int32 .npy
of token ids per source and side, documents joined by the tokenizer's EOS token. A rebuild
with the same tokenizer and settings reads them back.

Packing: calibration() cuts every source's stream into windows of `length` consecutive
tokens (documents run on into each other, separated by EOS: no padding, no position
restart, which favor refuses) and interleaves the sources' windows in a seeded order.
"""
import glob
import gzip
import hashlib
import html.parser
import inspect
import json
import os
import re
import subprocess
import sys
import zipfile
import zlib

import numpy as np

FORMAT = 1
OUT_OF_DOMAIN = "python-packages"
RUST = "/root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc/rust/html"
HERE = os.path.dirname(os.path.abspath(__file__))
SHAKESPEARE = os.path.join(HERE, "..", "shakespeare", "data", "tinyshakespeare.txt")


class Source:
    def __init__(self, name, licence, style, read):
        self.name, self.licence, self.style, self.read = name, licence, style, read


# ---- readers: each yields (document id, text) -----------------------------------------

def _shakespeare():
    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()
    # a document = a run of about 40 speeches (speeches are separated by blank lines)
    speeches = text.split("\n\n")
    for i in range(0, len(speeches), 40):
        yield f"speeches {i}", "\n\n".join(speeches[i:i + 40])


def _stdlib():
    sys.path.insert(0, HERE)
    from stdlib_text import docstrings
    cal, held = docstrings()
    # the stdlib study's own split is kept: its held-out modules stay held out
    for i, d in enumerate(cal):
        yield f"cal {i}", d
    for i, d in enumerate(held):
        yield f"held {i}", d


class _Text(html.parser.HTMLParser):
    """The text of an mdBook page's <main>, paragraphs and code blocks kept apart."""

    BLOCKS = {"p", "pre", "li", "h1", "h2", "h3", "h4", "h5", "tr", "blockquote", "dt", "dd"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.pre, self.parts = 0, 0, []

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.depth += 1
        if tag == "pre":
            self.pre += 1
        if tag == "h1" and self.depth:
            self.parts.append("\x00")  # a chapter starts
        if tag in self.BLOCKS and self.depth:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag == "main":
            self.depth -= 1
        if tag == "pre":
            self.pre -= 1

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def _rust_books():
    for book in ("book", "reference", "nomicon", "rust-by-example", "edition-guide", "cargo",
                 "embedded-book"):
        path = os.path.join(RUST, book, "print.html")
        if not os.path.exists(path):
            continue
        parser = _Text()
        with open(path, encoding="utf-8") as f:
            parser.feed(f.read())
        text = "".join(parser.parts)
        # a document = one chapter (the print page's h1 sections)
        for i, chapter in enumerate(text.split("\x00")):
            if chapter.strip():
                yield f"{book} {i}", chapter


def _vim_help():
    for path in sorted(glob.glob("/usr/share/vim/vim*/doc/*.txt")):
        with open(path, encoding="utf-8", errors="replace") as f:
            yield os.path.basename(path), f.read()


def _gnu_info():
    for path in sorted(glob.glob("/usr/share/info/*.info*.gz")):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
        # a document = one node (info nodes start after a 0x1f separator)
        for i, node in enumerate(text.split("\x1f")):
            if len(node) > 200:
                yield f"{os.path.basename(path)} {i}", node


def _man_pages(limit=1500):
    pages = sorted(glob.glob("/usr/share/man/man[157]/*.gz"))
    step = max(1, len(pages) // limit)  # an even sample: every step-th page
    env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0")
    for path in pages[::step]:
        try:
            out = subprocess.run(["man", "-l", "--no-hyphenation", "--no-justification", path],
                                 capture_output=True, text=True, env=env, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        text = re.sub(r".\x08", "", out)  # overstrike (bold, underline)
        text = "\n".join(re.sub(r"[ \t]+", " ", line).rstrip() for line in text.splitlines())
        if len(text) > 200:
            yield os.path.basename(path), text


def _java():
    found = [p for p in sorted(glob.glob("/usr/lib/jvm/*/lib/src.zip")) if os.path.isfile(p)]
    if not found:
        return
    with zipfile.ZipFile(found[0]) as z:  # the oldest JDK's sources found (17, else 25)
        for name in sorted(z.namelist()):
            if name.startswith(("java.base/java/util/", "java.base/java/lang/",
                                "java.base/java/io/", "java.base/java/time/",
                                "java.base/java/net/")) and name.endswith(".java"):
                yield name, z.read(name).decode("utf-8", errors="replace")


def _python_packages():
    """Third-party docstrings: numpy's and scipy's public modules (the out-of-domain
    held-out text)."""
    import importlib
    import warnings
    seen = set()
    for root in ("numpy", "scipy"):
        try:
            package = importlib.import_module(root)
        except ImportError:
            continue
        names = [root] + [f"{root}.{m}" for m in getattr(package, "__all__", [])
                          if not m.startswith("_")]
        for name in sorted(set(names)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    module = importlib.import_module(name)
                except Exception:
                    continue
            for attr in sorted(dir(module)):
                obj = getattr(module, attr, None)
                doc = inspect.getdoc(obj) if callable(obj) else None
                if doc and len(doc.split()) >= 40 and id(obj) not in seen:
                    seen.add(id(obj))
                    yield f"{name}.{attr}", doc


SOURCES = [
    Source("shakespeare", "public domain (Karpathy's tinyshakespeare)", "verse and drama",
           _shakespeare),
    Source("python-stdlib", "PSF-2.0 (CPython's docstrings, this interpreter's standard "
           "library)", "API documentation", _stdlib),
    Source("rust-books", "MIT OR Apache-2.0 (the Rust book, reference, nomicon, Rust by "
           "Example, edition guide, cargo and embedded books from rustup's rust-docs)",
           "technical books with code", _rust_books),
    Source("vim-help", "Vim licence (GPL-compatible charityware; Vim's :help files)",
           "reference manual", _vim_help),
    Source("gnu-info", "GFDL-1.3+ (GNU manuals from Debian's info files)", "manual prose",
           _gnu_info),
    Source("man-pages", "each Debian package's own licence (its /usr/share/doc/*/copyright: "
           "GPL, BSD, MIT and others); an even sample of sections 1, 5 and 7",
           "command reference", _man_pages),
    Source("java-source", "GPL-2.0 with the Classpath Exception (the src.zip of the first "
           "JDK under /usr/lib/jvm that has one, OpenJDK 17 or Temurin 25: java.base's util, "
           "lang, io, time and net)", "source code with Javadoc", _java),
]
HELD_OUT_ONLY = Source(OUT_OF_DOMAIN, "BSD-3-Clause (numpy's and scipy's docstrings, the "
                       "versions requirements.txt pins)", "API documentation, third party",
                       _python_packages)


def held_out(doc_id, source):
    """Whether a document is held out (never in the calibration)."""
    if source == "python-stdlib":
        return doc_id.startswith("held ")
    return zlib.crc32(f"{source}/{doc_id}".encode()) % 10 == 0


class Dedup:
    """Drops paragraphs of >= 40 characters seen before (case and whitespace folded)."""

    def __init__(self):
        self.seen, self.dropped = set(), 0

    def __call__(self, text):
        kept = []
        for para in re.split(r"\n\s*\n", text):
            folded = " ".join(para.split()).lower()
            if len(folded) >= 40:
                h = hashlib.sha1(folded.encode()).digest()
                if h in self.seen:
                    self.dropped += 1
                    continue
                self.seen.add(h)
            if para.strip():
                kept.append(para.rstrip())
        return "\n\n".join(kept)


def tokenizer_digest(tok):
    h = hashlib.sha256()
    for piece, i in sorted(tok.get_vocab().items(), key=lambda x: x[1]):
        h.update(f"{i} {piece}\n".encode())
    return h.hexdigest()[:16]


class Corpus:
    def __init__(self, folder, meta):
        self.folder, self.meta = folder, meta

    def ids(self, source, side):
        return np.load(os.path.join(self.folder, f"{source}.{side}.npy"))

    def held_out(self, source):
        """1-D int64 ids of a source's held-out documents (or OUT_OF_DOMAIN's whole)."""
        import torch
        return torch.from_numpy(self.ids(source, "held").astype(np.int64))

    def calibration(self, length, count=None, seed=0, sources=None):
        """[count, length] int64 windows of packed calibration text, every source's windows
        interleaved in a seeded order (count None: all of them)."""
        import torch
        windows = []
        for name in sources or [s for s in self.meta["sources"] if s != OUT_OF_DOMAIN]:
            ids = self.ids(name, "cal")
            n = ids.size // length
            if n:
                windows.append(torch.from_numpy(ids[:n * length].astype(np.int64)).view(n, length))
        every = torch.cat(windows)
        order = torch.randperm(every.shape[0], generator=torch.Generator().manual_seed(seed))
        every = every[order]
        if count is not None:
            if count > every.shape[0]:
                raise SystemExit(f"the corpus has {every.shape[0]} windows of {length}; "
                                 f"{count} were asked for")
            every = every[:count]
        return every


def build(tok, folder, cap=1_500_000, sources=None, progress=True):
    """Reads, deduplicates and tokenises every source (cached in folder); a Corpus."""
    settings = {"format": FORMAT, "cap": cap, "tokenizer": tokenizer_digest(tok),
                "sources": sources}
    path = os.path.join(folder, "corpus.json")
    if os.path.exists(path):
        with open(path) as f:
            meta = json.load(f)
        if meta.get("settings") == settings:
            return Corpus(folder, meta)
    os.makedirs(folder, exist_ok=True)
    eos = tok.eos_token_id
    dedup = Dedup()
    meta = {"settings": settings, "sources": {}}
    for source in SOURCES + [HELD_OUT_ONLY]:
        if sources is not None and source.name not in sources:
            continue
        sides = {"cal": [], "held": []}
        counts = {"documents": 0, "tokens_cal": 0, "tokens_held": 0}
        before = dedup.dropped
        try:
            documents = list(source.read())
        except OSError as e:  # a file the machine lists but cannot read
            print(f"corpus: {source.name}: {e}; skipped", flush=True)
            documents = []
        for doc_id, text in documents:
            text = dedup(text)
            if not text:
                continue
            side = "held" if source is HELD_OUT_ONLY or held_out(doc_id, source.name) \
                else "cal"
            if counts[f"tokens_{side}"] >= (cap if side == "cal" else cap // 5):
                continue
            ids = tok(text)["input_ids"] + [eos]
            sides[side].append(np.asarray(ids, dtype=np.int32))
            counts[f"tokens_{side}"] += len(ids)
            counts["documents"] += 1
        if not counts["documents"]:
            print(f"corpus: {source.name}: nothing found on this machine, skipped", flush=True)
            continue
        for side, parts in sides.items():
            ids = np.concatenate(parts) if parts else np.zeros(0, np.int32)
            np.save(os.path.join(folder, f"{source.name}.{side}.npy"), ids)
        counts["paragraphs_dropped_as_duplicates"] = dedup.dropped - before
        meta["sources"][source.name] = {"licence": source.licence, "style": source.style,
                                        **counts}
        if progress:
            print(f"corpus: {source.name}: {counts}", flush=True)
    with open(path, "w") as f:
        json.dump(meta, f, indent=1)
    return Corpus(folder, meta)


if __name__ == "__main__":
    import argparse
    sys.path.insert(0, os.path.join(HERE, "smollm2"))
    import smollm2
    ap = argparse.ArgumentParser(description="builds the corpus with SmolLM2's tokenizer")
    ap.add_argument("--out", default="runs/corpus")
    ap.add_argument("--cap", type=int, default=1_500_000)
    args = ap.parse_args()
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(smollm2.folder(), gguf_file=smollm2.GGUF)
    corpus = build(tok, args.out, cap=args.cap)
    print(json.dumps(corpus.meta, indent=1))
