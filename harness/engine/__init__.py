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
"""

# the layer order above, lowest first: the structure test reads it from here
LAYERS = ("model", "native", "io", "routing", "cache", "stream", "guess", "config", "run", "compose", "serve", "cli",
          "diag")
