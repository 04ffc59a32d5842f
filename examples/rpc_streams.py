"""Request/reply with data streams: a worker reads an upload of any size chunk by
chunk and answers with a stream of its own (``python examples/rpc_streams.py``, with
``$HOLDFAST_ADDRESS`` pointing at a broker or a proxy).

The README's data-stream block is this file's ``main``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from holdfast.sdk import Request, Session, StreamingReply, Worker


def main() -> None:
    """Upload 8 MiB, get its SHA-256 back as the payload and a report as a stream."""
    uri = "hf://examples/checksum"
    folder = tempfile.mkdtemp(prefix="holdfast-streams-")
    path = os.path.join(folder, "report.txt")
    with open(path, "wb") as report:
        report.write(b"checked by the example worker\n")
    os.chdir(folder)
    with open("big.bin", "wb") as big:
        big.write(os.urandom(8 << 20))
    with Session() as session:

        def handle(request: Request) -> StreamingReply:
            digest = hashlib.sha256()
            while chunk := request.streams["upload"].read(1 << 20):
                digest.update(chunk)
            return StreamingReply(digest.hexdigest().encode(), {}, {"report": open(path, "rb")})

        with Worker(session, uri, handle):
            with open("big.bin", "rb") as upload:
                reply = session.request(uri, b"", streams={"upload": upload}, timeout=600)
            for chunk in reply.streams["report"]:  # or reply.streams["report"].read(n)
                print(f"report: {chunk.decode().strip()}")
            with open("big.bin", "rb") as again:
                expected = hashlib.sha256(again.read()).hexdigest()
            print(f"digest matches: {reply.payload.decode() == expected}")


if __name__ == "__main__":
    main()
