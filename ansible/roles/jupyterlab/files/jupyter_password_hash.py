"""Print the password hash JupyterLab's config should hold (installed by the jupyterlab role).

Reads the password on stdin and the config file named by the first argument. Prints the
hash already in the config when it still matches the password (argon2 salts every new
hash, so re-hashing would rewrite the config on every run), otherwise a new hash.
Never prints the password.
"""

import json
import sys

from jupyter_server.auth import passwd, passwd_check

password = sys.stdin.read().rstrip("\n")
if not password:
    sys.exit("no password on stdin")
try:
    with open(sys.argv[1]) as f:
        current = json.load(f)["PasswordIdentityProvider"]["hashed_password"]
except (OSError, ValueError, KeyError, TypeError):
    current = ""
print(current if current and passwd_check(current, password) else passwd(password))
