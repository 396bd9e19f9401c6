"""What the tests share: generated models, real engine and bench processes, campaign files and folders, the
gates' streamed run, lanes, the peer, the loopback adbd. Fixtures are in conftest.py files, not here."""
