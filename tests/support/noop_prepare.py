"""A prepare step that writes nothing: `python -m tests.support.noop_prepare --out DIR` exits 0, so the
tests see what `rlvr` says when a prepare step ran and an input is still missing."""

if __name__ == "__main__":
    pass
