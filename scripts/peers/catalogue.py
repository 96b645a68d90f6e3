"""The peers' catalogue (catalogue.json beside this file): the one list of the peers and of the package
families scripts/peers/setup.sh installs. Standard library only (Debian's python3 and the peers' venv).

  python3 scripts/peers/catalogue.py pins FAMILY      the family's pip pins (setup.sh)
  python3 scripts/peers/catalogue.py imports FAMILY   its import line
  python3 scripts/peers/catalogue.py venv FAMILY      its venv folder in the source tree (.venv-peers, or its own)
  python3 scripts/peers/catalogue.py families         every family, comma-separated
  python3 scripts/peers/catalogue.py defaults         the families setup.sh installs by default
"""
import json
import os
import sys

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "catalogue.json")
with open(PATH) as _f:
    CATALOGUE = json.load(_f)

FAMILIES = CATALOGUE["families"]
PEERS = [p["name"] for p in CATALOGUE["peers"]]  # report order
FAMILY_OF = {p["name"]: p["family"] for p in CATALOGUE["peers"]}
MODULE_OF = {name: FAMILIES[f]["module"] for name, f in FAMILY_OF.items()}  # a peer's runner module
FAMILY_MODULES = {f: v["module"] for f, v in FAMILIES.items() if v["module"]}  # families with peers
COLORS = {p["name"]: p["color"] for p in CATALOGUE["peers"]}
INT8_PEERS = tuple(p["name"] for p in CATALOGUE["peers"] if p["products"] == "int8")


def peers_of(family):
    """The family's peers, in the catalogue's order: its runner module's KERNELS."""
    return tuple(name for name, f in FAMILY_OF.items() if f == family)


def main(argv):
    usage = "usage: catalogue.py pins|imports|venv FAMILY | families | defaults"
    if argv in (["families"], ["defaults"]):
        names = [f for f, v in FAMILIES.items() if argv[0] == "families" or v["default"]]
        print(",".join(names))
        return 0
    if len(argv) != 2 or argv[0] not in ("pins", "imports", "venv"):
        print(usage, file=sys.stderr)
        return 2
    family = FAMILIES.get(argv[1])
    if family is None:
        print(f"unknown family '{argv[1]}'; allowed: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    if argv[0] == "venv":
        print(family.get("venv", ".venv-peers"))
        return 0
    print(family["pip" if argv[0] == "pins" else "import"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
