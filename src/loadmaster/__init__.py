"""loadmaster: decides where virtual machines run and keeps every host inside its promises."""

from loadmaster.errors import LoadmasterError
from loadmaster.service import Loadmaster, open_loadmaster

open = open_loadmaster

__all__ = ["Loadmaster", "LoadmasterError", "open"]
