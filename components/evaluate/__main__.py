"""`python -m components.evaluate CONFIG --run-id ID --iteration C` or `--segment S` (the evaluate image's entry)."""

from components.core.stage_cli import stage_command
from components.evaluate.stage import run, serve

if __name__ == "__main__":
    stage_command("evaluate", run, shardable=True, serve=serve)()
