"""What the tests share: generated models, real engine and bench processes, folders, lanes, the peer."""
