#!/usr/bin/env python3
"""Test helper: plays systemd's side of sd_notify. Binds a unix datagram socket at argv[1] and prints
every message it receives as one line: "<seconds since start> <message with newlines as |>"."""
import os
import socket
import sys
import time

path = sys.argv[1]
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
print("LISTENING", flush=True)
t0 = time.monotonic()
while True:
    data = s.recv(65536).decode("utf-8", "replace")
    print(f"{time.monotonic() - t0:.3f} {data.replace(chr(10), '|')}", flush=True)
