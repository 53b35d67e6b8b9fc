"""``python -m dashboard.launch run dashboard/app.py [streamlit options]``: ``streamlit run`` in a
process that has already imported what the pages import (``fleetscope dashboard`` starts this through
``fleetscope.dashboard_main``, which registers the pages' configuration first).

In:  Streamlit's command line.
Out: the Streamlit server, its first viewer of each page not paying for the imports: Streamlit
     runs a page's script when someone opens it, and a first ``import analytics.drift``
     (scipy) takes over a second on a small machine. The modules are found by reading the page
     files' import statements (``dashboard/app.py`` and ``dashboard/screens/*.py``), so a new
     page needs no entry here; one that fails to import is left to fail, with its traceback,
     on its page. The dashboard's own modules and Streamlit's are left out: they are quick to
     import, and their ``st.cache_*`` decorators want the server's runtime. What they loaded is
     then frozen out of the garbage collector's passes (``gc.freeze``): Streamlit collects after
     every script run, and a pass over every library object cost each render 0.1-0.4 s.
"""

from __future__ import annotations

import ast
import gc
import importlib
import sys
import time
from pathlib import Path

__all__ = ["main", "page_imports", "preload"]

HERE = Path(__file__).resolve().parent


def page_imports(files: list[Path] | None = None) -> list[str]:
    """The modules the page files import (top level and inside functions), sorted."""
    found: set[str] = set()
    for path in files if files is not None else [HERE / "app.py", *sorted((HERE / "screens").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return sorted(name for name in found if not name.startswith(("dashboard", "streamlit", "__future__")))


def preload(modules: list[str] | None = None) -> tuple[int, float, dict[str, str]]:
    """Import ``modules`` (default: ``page_imports()``): (how many imported, seconds, the ones that
    failed -> why)."""
    t0 = time.perf_counter()
    done, failed = 0, {}
    for name in modules if modules is not None else page_imports():
        try:
            importlib.import_module(name)
            done += 1
        except Exception as exc:  # noqa: BLE001 - the page that needs it shows the error in full
            failed[name] = f"{type(exc).__name__}: {exc}"
    return done, time.perf_counter() - t0, failed


def main() -> None:
    root = str(HERE.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    count, seconds, failed = preload()
    # A full garbage collection (Streamlit's after every script run, unless runner.postScriptGC is
    # off, or Python's own now and then) with the libraries above in the heap took 0.1-0.4 s of a
    # page's render. Their objects live as long as the process: moved out of the collector's
    # sight, a collection scans only what the pages make.
    gc.freeze()
    print(f"fleetscope dashboard: {count} modules the pages use loaded in {seconds:.1f}s", file=sys.stderr, flush=True)
    for name, why in failed.items():
        print(
            f"fleetscope dashboard: cannot import {name} ({why}); the pages that use it will say so",
            file=sys.stderr,
            flush=True,
        )
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
