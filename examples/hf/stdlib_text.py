"""Real English text that ships with every Python: the standard library's docstrings, split
by module into calibration and held-out parts (a module's docstrings all go to one side, so
held-out text is never seen in calibration), and a pairing task built from the held-out
part: each docstring's first paragraph (the query) is to find the rest of that docstring
(its document) among all held-out documents.

    cal, held = docstrings()              # lists of str
    pairs = pairs_of(held)                # [(query, document)]
"""
import importlib
import inspect
import sys
import warnings
import zlib

# modules that open windows, print on import, or are not text-rich
_SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc_data",
         "lib2to3", "ensurepip", "venv", "__hello__", "__phello__", "_pydev_bundle",
         "msvcrt", "winreg", "winsound", "nt", "_winapi"}


def _modules():
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in _SKIP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            try:
                yield name, importlib.import_module(name)
            except Exception:  # platform modules absent here
                continue


def _docs_of(module):
    seen = [inspect.getdoc(module)]
    for _, obj in inspect.getmembers(module):
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        seen.append(inspect.getdoc(obj))
        if inspect.isclass(obj):
            for _, member in inspect.getmembers(obj):
                if inspect.isfunction(member) and member.__qualname__.startswith(obj.__name__):
                    seen.append(inspect.getdoc(member))
    return [d for d in seen if d]


def docstrings(min_words=40, held_out_share=4):
    """(calibration, held_out): docstrings of >= min_words words, deduplicated; a module is
    held out when crc32(name) % held_out_share == 0 (about a quarter of them)."""
    cal, held, seen = [], [], set()
    for name, module in _modules():
        side = held if zlib.crc32(name.encode()) % held_out_share == 0 else cal
        for doc in _docs_of(module):
            doc = " ".join(doc.split()) if "\n\n" not in doc else doc
            if len(doc.split()) >= min_words and doc not in seen:
                seen.add(doc)
                side.append(doc)
    return cal, held


def pairs_of(docs, min_words=8):
    """(query, document) pairs: the first paragraph (or first sentence) and the rest."""
    pairs = []
    for doc in docs:
        parts = doc.split("\n\n", 1)
        if len(parts) == 1:
            cut = doc.find(". ")
            parts = [doc[:cut + 1], doc[cut + 2:]] if cut > 0 else [doc]
        if len(parts) == 2:
            q, d = (" ".join(p.split()) for p in parts)
            if len(q.split()) >= min_words and len(d.split()) >= min_words:
                pairs.append((q, d))
    return pairs


if __name__ == "__main__":
    c, h = docstrings()
    print(f"python {sys.version.split()[0]}: {len(c)} calibration and {len(h)} held-out "
          f"docstrings, {len(pairs_of(h))} held-out pairs")
