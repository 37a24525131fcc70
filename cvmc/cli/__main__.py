"""`python -m cvmc.cli`: the `cvmc` command."""
from cvmc.cli import entry

entry()
