"""A DNS server for the tests' outside world: `python3 dns_server.py IP NAME=ADDR...` answers
A queries for each NAME with ADDR and every other name with NXDOMAIN, on IP port 53 (UDP)."""

import socket
import sys


def answer(query: bytes, names: dict) -> bytes:
    at, labels = 12, []
    while at < len(query) and query[at] != 0:
        n = query[at]
        labels.append(query[at + 1 : at + 1 + n].decode(errors="replace"))
        at += 1 + n
    end = at + 5
    qtype = int.from_bytes(query[at + 1 : at + 3], "big")
    addr = names.get(".".join(labels).lower())
    header = bytearray(query[:end])
    header[2] = 0x84 | (query[2] & 0x01)
    header[3] = 0x00 if addr else 0x03
    header[6:12] = bytes(6)
    if addr and qtype == 1:
        header[7] = 1
        header += bytes([0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]) + socket.inet_aton(addr)
    return bytes(header)


def main():
    ip, names = sys.argv[1], dict(a.lower().split("=", 1) for a in sys.argv[2:])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 53))
    while True:
        query, peer = s.recvfrom(512)
        if len(query) >= 17:
            s.sendto(answer(query, names), peer)


if __name__ == "__main__":
    main()
