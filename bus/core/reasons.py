"""Every reason token the bus records when it refuses something or ends a job, in one place.

A token is what an operator greps for: it is stored in dead letters (``reason``), in the
``reason`` of a message or job that ended in error (followed by ``": <detail>"``), and sent to a
peer in a nack. :class:`Reason` is a ``StrEnum``, so a member equals its token: the Lua scripts
return the same strings and Python compares their replies with the members.

``python -m bus.core.reasons`` prints the table of docs/guarantees/refusals.md; a test keeps
the two equal.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """A refusal or failure token; ``doc`` says what it means and who emits it."""

    doc: str

    def __new__(cls, value: str, doc: str = "") -> Reason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.doc = doc
        return member

    # -- a message refused on admission (node/intake/admission.py, node/flows/trust.py) ------
    MALFORMED = (
        "malformed",
        "The message (or flow document) cannot be parsed, or its fields contradict each other. "
        "Admission, the consumer, stops, the flow engine.",
    )
    WRONG_CONTEXT = "wrong_context", "The message names another context than the one it is in."
    WRONG_DESTINATION = (
        "wrong_destination",
        "The message (or flow job) is addressed to another node or context. Admission.",
    )
    WRONG_ORIGIN = "wrong_origin", "A message in `msg_out` does not name this node as origin."
    UNKNOWN_DESTINATION = (
        "unknown_destination",
        "The destination node is not a known peer, or a flow job names an unknown node or "
        "context. The supervisor, the flow engine.",
    )
    OVERSIZE = (
        "oversize",
        "The message or its script is larger than the node accepts. Admission, links, outbox.",
    )
    EXPIRED = (
        "expired",
        "The message is older than the freshness window, past its ack deadline, or a flow "
        "document past `expires_at`. Admission, links, flow trust.",
    )
    FROM_FUTURE = "from_future", "The message is dated further ahead than the allowed skew."
    FORGED_RESULT = "forged_result", "A result in `msg_out` was not signed by this node."
    UNKNOWN_SIGNER = "unknown_signer", "No key is registered for the message's signer."
    BAD_SIGNATURE = (
        "bad_signature",
        "A signature is missing, malformed, of an unsupported algorithm, or does not verify "
        "(a message's, or a peer's handshake signature).",
    )
    WRONG_SIGNER = (
        "wrong_signer",
        "The message is signed by another key than the one that may sign it (a result from a "
        "node the request was not sent to, a flow submitted by another actor).",
    )
    WRONG_ALGORITHM = (
        "wrong_algorithm",
        "The signature is of another algorithm than the signer's registered key, or the "
        "signer's key algorithm is not accepted in the context (`[algorithms]`). Admission.",
    )
    MALFORMED_KEY = (
        "malformed_key",
        "A secp256k1 public key in a signature is not 33 bytes of hex starting with 02 or 03. "
        "Admission.",
    )
    UNCOMPRESSED_KEY = (
        "uncompressed_key",
        "A secp256k1 public key in a signature is in the uncompressed form (04 + x + y); only "
        "the compressed form is accepted. Admission.",
    )
    INVALID_POINT = (
        "invalid_point",
        "A secp256k1 public key in a signature is not a point on the curve. Admission.",
    )
    HIGH_S = (
        "high_s",
        "A secp256k1 signature has s > n/2; only low-S signatures are accepted (one valid "
        "signature per message and key). Admission.",
    )
    UNKNOWN_CONTEXT = (
        "unknown_context",
        "The context does not exist on this node (or an entry names a database it does not "
        "serve). Admission, flow trust, the outbox, the store.",
    )
    PERMISSION_DENIED = (
        "permission_denied",
        "The actor may not run jobs in the context, or stop this job. Admission, stops.",
    )
    REPLAY = (
        "replay",
        "The message key or nonce was accepted already within the freshness window, or a flow "
        "job was released already. Admission, materialise, the consumer, flow trust.",
    )
    UNKNOWN_JOB = "unknown_job", "A stop message names a job this context does not hold."
    BAD_REPLY_TO = (
        "bad_reply_to",
        "The message's `reply_to` is not an inbox name (1 to 64 of `A-Za-z0-9_.-`). Admission.",
    )
    JOB_EXISTS = "job_exists", "A job key of the message is held by another message already."
    UNKNOWN_REQUEST = "unknown_request", "A result answers a request this node never sent."
    LATE_RESULT = (
        "late_result",
        "A result arrived after its request timed out (`timeout_ack`/`timeout_result`). The "
        "consumer.",
    )
    INVALID_FLOW = "invalid_flow", "A flow document does not describe a valid DAG. Flow trust."
    UNKNOWN_FLOW = "unknown_flow", "A flow event names no flow of the context. The flow engine."
    QUOTA_EXCEEDED = (
        "quota_exceeded",
        "Queuing the message's jobs would take its actor past its queue bound in the context "
        "(`max_queued_per_actor`), or the context past its own (`max_queued_per_context`; "
        "`[queue_limits]` per context). Materialise, for admission.",
    )
    INTERNAL_ERROR = (
        "internal_error",
        "Handling the message raised an unexpected exception (a bug): the message is refused "
        "so the queue goes on. The supervisor, the consumer.",
    )

    # -- a queue entry refused (bus/store/connection.py, bus/wire/outbox.py, node/runners/)
    MISSING_HASH = (
        "missing_hash",
        "A queue entry names a key that holds no hash. Every queue's service.",
    )
    WRONG_TYPE = (
        "wrong_type",
        "A queue entry names a key that holds another type than the one expected.",
    )
    NOT_A_NUMBER = "not_a_number", "A field that must be an integer is not (or overflows)."
    NOT_UTF8 = "not_utf8", "A queue entry is not valid UTF-8. The store."
    MALFORMED_ENTRY = (
        "malformed_entry",
        "A queue entry is not of the form its queue requires. The outbox, the flow engine.",
    )
    MALFORMED_JOB = (
        "malformed_job",
        "A job hash cannot be run or answered (no status, a bad attempt, fields that do not "
        "parse). The runners.",
    )
    NOT_ADMITTED = (
        "not_admitted",
        "A job hash bears no valid admission stamp (bus/core/admitted.py): it was written, or "
        "changed, by someone other than this node's admission. Never run. The runners.",
    )
    TOO_MANY_DELIVERIES = (
        "too_many_deliveries",
        "An in-flight entry was taken back more times than `max_redeliveries` after restarts: "
        "set aside instead of requeued. The store.",
    )

    # -- links between nodes (node/links/frames.py, node/daemon.py) ---------------------------
    BAD_FRAME = "bad_frame", "A peer sent a frame that cannot be decoded or is unexpected."
    REFUSED_DELIVERY = (
        "refused_delivery",
        "A message a peer delivered was refused at once (its detail says why). Links.",
    )
    PEER_REFUSED = (
        "peer_refused",
        "Prefix: the peer refused the message; `peer_refused_<its reason>` names why. Links.",
    )

    # -- a link refused during its handshake (bus/core/handshake.py, bus/wire/transport.py): logged
    # only --
    MALFORMED_HELLO = "malformed_hello", "The peer's hello frame lacks or mistypes a field."
    VERSION_MISMATCH = "version_mismatch", "The peer speaks another protocol version."
    BAD_NODE_ID = "bad_node_id", "The node id in the peer's hello is not a public key."
    BAD_NONCE = "bad_nonce", "The nonce in the peer's hello is not of the required hex length."
    UNEXPECTED_NODE = "unexpected_node", "The node that answered is not the one dialled."
    UNKNOWN_NODE = "unknown_node", "The node that connected is not a known peer."
    MALFORMED_FRAME = "malformed_frame", "A handshake frame cannot be decoded."
    UNEXPECTED_FRAME = "unexpected_frame", "A handshake frame of another type than the next one."
    LISTENER_FULL = (
        "listener_full",
        "Too many connections had not finished their handshake; a new one was closed at once. "
        "The listener.",
    )
    ADDRESS_FULL = (
        "address_full",
        "Too many connections from one address had not finished their handshake; a new one "
        "was closed at once. The listener.",
    )

    # -- why a job ended in error (its result's reason) -----------------------------------------
    TIMEOUT_ACK = "timeout_ack", "The destination did not acknowledge in time. Deadlines."
    TIMEOUT_RESULT = "timeout_result", "No result came back in time. Deadlines."
    PEER_UNAVAILABLE = (
        "peer_unavailable",
        "The destination peer's circuit breaker is open (its link keeps failing) and will not "
        "try again before the message's ack deadline. The supervisor.",
    )
    TIMEOUT = "timeout", "The job ran longer than its `timeout_s` and was killed. Runners."
    RUNNER_LOST = (
        "runner_lost",
        "The process running the job died, or the external runner's lease expired. Runners.",
    )
    STOPPED = "stopped", "The job was stopped by its caller or an admin. Stops, runners."
    MEMORY_LIMIT = (
        "memory_limit",
        "The job ran out of its memory limit (`[limits] memory_mb`: its whole tree's memory, "
        "/tmp included, where the node has cgroups; else the address space of each of its "
        "processes): an allocation failed, or the kernel killed a process of it. Runners.",
    )
    CPU_LIMIT = (
        "cpu_limit",
        "The job used up its CPU time limit (`[limits] cpu_s`, per process) and was killed "
        "(SIGXCPU, then SIGKILL). Runners.",
    )
    PIDS_LIMIT = (
        "pids_limit",
        "The job could not start another process or thread (`[limits] processes`: its whole "
        "tree's, where the node has cgroups) and ended on it. Runners.",
    )
    DISK_LIMIT = (
        "disk_limit",
        "The job wrote past its context's disk quota (`[limits] disk_mb`, the work dir as a "
        "whole) or filled its /tmp, and ended on it (ENOSPC or EDQUOT). Runners.",
    )
    FILE_SIZE_LIMIT = (
        "file_size_limit",
        "The job wrote a file larger than its file size limit (`[limits] file_size_mb`; "
        "SIGXFSZ). Runners.",
    )
    OUTPUT_LIMIT = (
        "output_limit",
        "The job's stdout or stderr grew past its file size limit (`[limits] file_size_mb`) and "
        "the job was stopped there; what is kept of it is at most `max_output_bytes`. Runners.",
    )
    UNKNOWN_SCRIPT_TYPE = (
        "unknown_script_type",
        "No runner for the job's script type on this node. Materialise.",
    )
    ISOLATION_REFUSED = (
        "isolation_refused",
        "The node can build no sandbox, so its own runners run no job (the detail says why and "
        "what to do on that host; `hero-node status` too). Materialise.",
    )
    PREREQUISITE_FAILED = (
        "prerequisite_failed",
        "A prerequisite of the flow job ended in error, so it never runs. The flow engine.",
    )
    FLOW_DEADLINE = (
        "flow_deadline",
        "The flow's deadline passed before the job finished. The flow engine.",
    )


def markdown_table() -> str:
    """The docs' table of every reason, in declaration order."""
    rows = ["| Reason | Meaning |", "| --- | --- |"]
    rows += [f"| `{reason}` | {reason.doc} |" for reason in Reason]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
