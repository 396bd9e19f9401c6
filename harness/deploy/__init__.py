"""`bmoe-bench deploy`: bmoe at the harness's version in a venv on an SSH target (`venv`), the stamp and source
archive that say which version is there (`stamp`), the wheels packed from the harness's own environment (`wheels`)
and the build tools bmoe's build needs (`build_tools`, run by scripts/setup.sh before anything is installed: this
package imports nothing)."""
