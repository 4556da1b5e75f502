"""`python -m components.generate CONFIG --run-id ID --iteration I` or `--segment S` (the generate image's entry)."""

from components.core.stage_cli import stage_command
from components.generate.stage import run, serve

if __name__ == "__main__":
    stage_command("generate", run, shardable=True, serve=serve)()
