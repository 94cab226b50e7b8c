"""`corral ws ssh NAME [ssh options] [command]`: options go before the destination, a remote
command after it (the command used to come before it, and ssh took it for the host name)."""

from __future__ import annotations

from corral.cli.workspaces import ssh_argv


def test_options_go_before_the_destination_and_a_command_after_it() -> None:
    dest = "ann+nb@corral.example"
    assert ssh_argv("ssh", 2222, dest, []) == ["ssh", "-p", "2222", dest]
    assert ssh_argv("ssh", 2222, dest, ["id -u; ls /logs"]) == ["ssh", "-p", "2222", dest, "id -u; ls /logs"]
    forward = ["-L", "6006:localhost:6006", "-N"]
    assert ssh_argv("ssh", 2222, dest, forward) == ["ssh", "-p", "2222", *forward, dest]
    mixed = ["-vL", "8888:localhost:8888", "-o", "ServerAliveInterval=30", "-t", "htop", "-d"]
    assert ssh_argv("ssh", 22, dest, mixed) == [
        "ssh",
        "-p",
        "22",
        "-vL",
        "8888:localhost:8888",
        "-o",
        "ServerAliveInterval=30",
        "-t",
        dest,
        "htop",
        "-d",
    ]
    attached = ["-L6006:localhost:6006", "--", "-weird-command"]
    expected = ["ssh", "-p", "22", "-L6006:localhost:6006", dest, "-weird-command"]
    assert ssh_argv("ssh", 22, dest, attached) == expected
