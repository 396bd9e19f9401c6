"""Every stored format, declared once: its version, its schema, its writer and its reader.

One module per format. Modules here import nothing from harness/ but `harness.errors`; everything above
(engine, runner, report, replay, the tests' fake engine) reads and writes through them."""
