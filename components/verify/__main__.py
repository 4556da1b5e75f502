"""`python -m components.verify CONFIG --run-id ID --iteration I` or `--segment S` (the verify image's entry)."""

from components.core.stage_cli import stage_command
from components.verify.stage import run, serve

if __name__ == "__main__":
    stage_command("verify", run, shardable=True, serve=serve)()
