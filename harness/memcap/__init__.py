"""Memory footprint under a cap: the smallest cgroup memory cap at which an engine command runs (search, over
real capped runs: probe), and where the memory of a run goes (smaps: its mappings by kind; imports: the Python
interpreter's modules, import by import)."""
