"""`modelpool credentials set|list|remove`: keys a models.yaml or a stack names
(`api_key_env: NGC_API_KEY`), saved once in a file only the user can read (mode 0600) so
that neither the shell history nor a YAML file ever holds them.

The value is read from a no-echo prompt, or from stdin when it is not a terminal
(`printenv NGC_API_KEY | modelpool credentials set NGC_API_KEY`), never from the command
line, where `ps` would show it. Nothing here prints a value."""

from __future__ import annotations

import getpass
import sys
from typing import Annotated

import typer

from modelpool.cli.output import echo_err
from modelpool.client.credentials import (
    MAX_VALUE,
    credentials_file,
    remove_credential,
    save_credential,
    saved_credentials,
)
from modelpool.client.errors import ConfigError

app = typer.Typer(help="Save the API keys models.yaml and stacks name (never on the command line).",
                  no_args_is_help=True)  # fmt: skip
NameArg = Annotated[str, typer.Argument(help="The environment variable it stands for, e.g. NGC_API_KEY.")]


@app.command("set")
def set_credential(name: NameArg) -> None:
    """Save a key: typed at a no-echo prompt, or piped on stdin (its first line)."""
    try:
        value = _read_value(name)
        path = save_credential(name, value)
    except (EOFError, KeyboardInterrupt):
        echo_err(f"error: no value given for {name}: nothing saved")
        raise typer.Exit(2) from None
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
    typer.echo(f"saved {name} in {path} (mode 0600)")


def _read_value(name: str) -> str:
    """A no-echo prompt on a terminal, else stdin's first line (undecodable bytes: refused)."""
    if sys.stdin is None:
        raise EOFError
    if sys.stdin.isatty():
        return getpass.getpass(f"{name}: ")
    try:
        return sys.stdin.readline(MAX_VALUE + 2).rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(f"the value for {name} is not text in the terminal's encoding") from None


@app.command("list")
def list_credentials() -> None:
    """The names of the saved keys (never their values)."""
    try:
        names = sorted(saved_credentials())
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
    typer.echo("\n".join(names) if names else f"no saved keys ({credentials_file()})")


@app.command("remove")
def remove(name: NameArg) -> None:
    """Forget a saved key."""
    try:
        removed = remove_credential(name)
    except ConfigError as exc:
        echo_err(f"error: {exc.message}")
        raise typer.Exit(2) from None
    typer.echo(f"removed {name}" if removed else f"{name} was not saved")
