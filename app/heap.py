"""Keep the garbage collection Streamlit runs after every rerun cheap: freeze the long-lived heap once imports settle.

Streamlit calls gc.collect(2) at the end of each script run (its `runner.postScriptGC` option), and a full
collection traverses every object the collector tracks. In the dashboard's server those are mostly the imported
modules' functions, classes and tables — streamlit, pandas, pyarrow, altair, rcdiag: ~250k objects, 80–170 ms per
rerun on the benchmark machine, the largest single cost of a control's rerun, paid while the last delta and the
"script finished" message wait (the collection holds the GIL). `gc.freeze()` moves the objects alive now to a
permanent generation that collections skip; objects created later are collected as before.

Frozen objects that later become cyclic garbage are never collected, so `settle` freezes again only when
`sys.modules` grew since the last freeze (a page's first visit imports its modules): the number of freezes, and
with it what non-module state they catch (a session's widgets, the page's script namespace), is bounded by the
number of import events, not by the number of reruns. At exit the heap is unfrozen, so that the interpreter's
last collections see every object again (nanobind-based extensions otherwise report their functions as leaked).
"""
from __future__ import annotations

import atexit
import gc
import sys

_FROZEN_AT = [0]
"""len(sys.modules) at the last freeze (0: never frozen)."""


def settle() -> bool:
    """Collect, then freeze the surviving heap, when modules were imported since the last freeze; True when it did.
    Called at the end of each full script run (app.dashboard.run)."""
    modules = len(sys.modules)
    if modules <= _FROZEN_AT[0]:
        return False
    gc.collect()  # garbage made so far is freed, not frozen
    if not _FROZEN_AT[0]:
        atexit.register(gc.unfreeze)
    gc.freeze()
    _FROZEN_AT[0] = modules
    return True
