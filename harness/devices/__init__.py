"""Devices reached through a remote shell: one base (`remote.RemoteShell`: the checked push and pull, the device's
reads, a run's process bookkeeping) that adb (`adb.Device`, through `adb_client`'s server and `adb_stream`'s shell
v2 decoder) and SSH (`ssh.SshLink`) implement with their own transport; what is sent to the shell (`sh`), the pure
parsers of its answers (`parse`), the device-state sample (`state`), the throttling a run's samples show
(`throttle`), the bounds of every call (`timeouts`) and the listing of `bmoe-bench devices` (`listing`). The
campaign targets built on these are in harness.targets."""
