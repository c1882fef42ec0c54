"""Print the requirements of modelpool with the given extras, read from pyproject.toml, one a
line: the image installs them before it copies the source, so that a source change does not
reinstall them. Extras that name modelpool itself (`speech` takes `modelpool[audio]`) are
followed.

    python requirements.py pyproject.toml audio,llama     # the core dependencies and two extras
    python requirements.py pyproject.toml ray --extras-only
"""

import re
import sys
import tomllib

SELF = re.compile(r"^modelpool\[([^\]]+)\]$")


def requirements(project: dict, extras: list[str], core: bool) -> list[str]:
    optional = project.get("optional-dependencies", {})
    wanted, seen, out = list(extras), set(), list(project["dependencies"]) if core else []
    while wanted:
        extra = wanted.pop().strip()
        if not extra or extra in seen:
            continue
        if extra not in optional:
            sys.exit(f"no extra {extra!r} in pyproject.toml (there are: {', '.join(sorted(optional))})")
        seen.add(extra)
        for requirement in optional[extra]:
            own = SELF.match(requirement.replace(" ", ""))
            if own:
                wanted += own.group(1).split(",")
            else:
                out.append(requirement)
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as file:
        project = tomllib.load(file)["project"]
    print("\n".join(requirements(project, sys.argv[2].split(","), core="--extras-only" not in sys.argv)))
