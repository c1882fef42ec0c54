"""Who a stored thing belongs to: the API key that wrote it (stored responses, transcript
sources). Keys see only what they wrote; a key with the admin scope sees everything.

With no keys configured nothing is checked anywhere (the admin routes are open too), so
every caller is the one anonymous owner and sees everything, whichever key wrote it while
keys were configured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    name: str
    """The key's `name` in the config ("" without keys)."""
    admin: bool = False
    """The key holds the admin scope: it sees what every key wrote."""

    def sees(self, owner: str) -> bool:
        """Whether this caller may read what `owner` wrote."""
        return self.admin or owner == self.name


ANONYMOUS = Owner("", admin=True)
"""Every caller of a server without keys."""
