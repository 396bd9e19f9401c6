"""bmoe's engine: routed experts streamed from flash into llama.cpp through its public API.

Subpackages by concern, in layer order: a module imports only from its own layer or the layers before it
(tests/engine/test_structure.py checks it; docs/architecture.md draws it).

    model    GGUF layout, architecture registry, llama.cpp facts, prompts and chat templates
    native   the C twins (found here, wrapped by their concern's module, each with a Python fallback)
    io       reads, lanes, page release, dense weights, lazy mapping, faults, traces, machine readings
    routing  early router, route-ahead, route replay, cold-expert dropping
    cache    the expert cache, its budget, policies, evictor, prefetch
    stream   the eval-callback hook and its stages
    guess    guess-ahead (prompt lookup, MTP) and batch exactness
    config   every `bmoe` flag, declared once (config/fields.py; its rules in rules.py, its README table in doc.py)
    run      Engine, Session (the llama.cpp adapter), TokenLoop, sinks
    compose  the composition root: a validated config to a wired Engine (compose.py)
    serve    conversations, the --session protocol, chat, the OpenAI server and its page
    cli      the `bmoe` command (cli.py): the only place that prints results and reads the environment
    diag     measurement tools nothing above imports

Each package's docstring ends with what it may import, a "May import" sentence: engine layers by name, other modules of
harness by their dotted name; a package imports its own modules freely. The structure test holds every import to it.
The engine package itself (cli.py, compose.py):

May import: harness.__version__, harness.errors, harness.formats, harness.hub (`bmoe pull`).

The facade: what the harness outside the engine may import from it is `from harness.engine import NAME` with NAME in
`__all__` below, nothing deeper (the structure test checks it). Each name is loaded from its home on first use, so
`import harness.engine` itself loads no engine module and no third-party package (tests/engine/test_engine_imports.py).

    SPECS, parse_cli                        every `bmoe` flag and the engine's own parser: a campaign is refused at
                                            validation as the engine would refuse it; the engine's defaults
    ExpertCache, token_cycle_bytes          the expert cache the offline replay drives, and one token's bytes
    POLICIES, ONLINE_DEFAULT, Key, Policy,  its eviction policies (MarkovDuel: the base of the replay's informed
    MarkovDuel, is_offline,                 bounds; is_offline: the future-knowing ones, replay only)
    online_policies
    use_reference                           the policies' numpy reference forced (the replay-cost worker's --pure:
                                            the engine reads no environment, its command line does)
    SliceReader, PAGE                       the engine's read lanes and page size (the storage probe reads with them)
    ModelLayout, load_layout                a model file's expert slices (the storage probe reads those)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names' homes, for a reader and a type checker; _EXPORTS says the same (a test holds it)
    from harness.engine.cache.expert_cache import ExpertCache, token_cycle_bytes
    from harness.engine.cache.policies import (
        ONLINE_DEFAULT,
        POLICIES,
        Key,
        MarkovDuel,
        Policy,
        is_offline,
        online_policies,
    )
    from harness.engine.cache.policies.native import use_reference
    from harness.engine.config import SPECS, parse_cli
    from harness.engine.io.reader import SliceReader
    from harness.engine.io.vm import PAGE
    from harness.engine.model.gguf_layout import ModelLayout, load_layout

# name -> its home module
_EXPORTS: dict[str, str] = {
    "SPECS": "harness.engine.config", "parse_cli": "harness.engine.config",
    "ExpertCache": "harness.engine.cache.expert_cache", "token_cycle_bytes": "harness.engine.cache.expert_cache",
    **dict.fromkeys(("POLICIES", "ONLINE_DEFAULT", "Key", "Policy", "MarkovDuel", "is_offline", "online_policies"),
                    "harness.engine.cache.policies"),
    "use_reference": "harness.engine.cache.policies.native",  # the policies' reference, for a replay worker
    "SliceReader": "harness.engine.io.reader", "PAGE": "harness.engine.io.vm",
    "ModelLayout": "harness.engine.model.gguf_layout", "load_layout": "harness.engine.model.gguf_layout",
}
__all__ = ["ExpertCache", "Key", "MarkovDuel", "ModelLayout", "ONLINE_DEFAULT", "PAGE", "POLICIES", "Policy", "SPECS",
           "SliceReader", "is_offline", "load_layout", "online_policies", "parse_cli", "token_cycle_bytes",
           "use_reference"]


def __getattr__(name: str) -> Any:
    """An exported name, imported from its home the first time it is asked for (PEP 562)."""
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


# the layer order above, lowest first: the structure test reads it from here
LAYERS = ("model", "native", "io", "routing", "cache", "stream", "guess", "config", "run", "compose", "serve", "cli",
          "diag")
