from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_OK: _ClassVar[Status]
    STATUS_INVALID_ARGUMENT: _ClassVar[Status]
    STATUS_INVALID_GUID: _ClassVar[Status]
    STATUS_PAYLOAD_TOO_LARGE: _ClassVar[Status]
    STATUS_NOT_WRITABLE: _ClassVar[Status]
    STATUS_NOT_READABLE: _ClassVar[Status]
    STATUS_UNKNOWN_QUEUE: _ClassVar[Status]
    STATUS_UNKNOWN_GUID: _ClassVar[Status]
    STATUS_MALFORMED_FRAME: _ClassVar[Status]
    STATUS_UNKNOWN_FRAME: _ClassVar[Status]
    STATUS_PROTOCOL_ERROR: _ClassVar[Status]
    STATUS_VERSION_MISMATCH: _ClassVar[Status]
    STATUS_ALREADY_OPEN: _ClassVar[Status]
    STATUS_STORE_ERROR: _ClassVar[Status]
    STATUS_SHUTTING_DOWN: _ClassVar[Status]
    STATUS_INVALID_PROPERTIES: _ClassVar[Status]
    STATUS_UNKNOWN: _ClassVar[Status]
    STATUS_TOO_OLD: _ClassVar[Status]
    STATUS_CONFLICT: _ClassVar[Status]
    STATUS_HISTORY_FULL: _ClassVar[Status]
    STATUS_QUEUE_FULL: _ClassVar[Status]
    STATUS_QUEUE_IN_USE: _ClassVar[Status]
    STATUS_UNAUTHENTICATED: _ClassVar[Status]
    STATUS_PERMISSION_DENIED: _ClassVar[Status]
    STATUS_LIMIT_EXCEEDED: _ClassVar[Status]
    STATUS_NOT_FOUND: _ClassVar[Status]
    STATUS_DATA_LOST: _ClassVar[Status]
    STATUS_DELIVERIES_REVOKED: _ClassVar[Status]
STATUS_UNSPECIFIED: Status
STATUS_OK: Status
STATUS_INVALID_ARGUMENT: Status
STATUS_INVALID_GUID: Status
STATUS_PAYLOAD_TOO_LARGE: Status
STATUS_NOT_WRITABLE: Status
STATUS_NOT_READABLE: Status
STATUS_UNKNOWN_QUEUE: Status
STATUS_UNKNOWN_GUID: Status
STATUS_MALFORMED_FRAME: Status
STATUS_UNKNOWN_FRAME: Status
STATUS_PROTOCOL_ERROR: Status
STATUS_VERSION_MISMATCH: Status
STATUS_ALREADY_OPEN: Status
STATUS_STORE_ERROR: Status
STATUS_SHUTTING_DOWN: Status
STATUS_INVALID_PROPERTIES: Status
STATUS_UNKNOWN: Status
STATUS_TOO_OLD: Status
STATUS_CONFLICT: Status
STATUS_HISTORY_FULL: Status
STATUS_QUEUE_FULL: Status
STATUS_QUEUE_IN_USE: Status
STATUS_UNAUTHENTICATED: Status
STATUS_PERMISSION_DENIED: Status
STATUS_LIMIT_EXCEEDED: Status
STATUS_NOT_FOUND: Status
STATUS_DATA_LOST: Status
STATUS_DELIVERIES_REVOKED: Status

class QueuePolicy(_message.Message):
    __slots__ = ("max_deliveries", "ttl_ms", "dead_letter_uri", "max_messages", "max_bytes", "redirect_uri")
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_URI_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_URI_FIELD_NUMBER: _ClassVar[int]
    max_deliveries: int
    ttl_ms: int
    dead_letter_uri: str
    max_messages: int
    max_bytes: int
    redirect_uri: str
    def __init__(self, max_deliveries: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., dead_letter_uri: _Optional[str] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., redirect_uri: _Optional[str] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("uri", "ready", "unconfirmed", "bytes", "consumers", "handles", "oldest_age_seconds", "accepted", "redelivered", "rejected", "dead_lettered", "expired", "policy")
    URI_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    uri: str
    ready: int
    unconfirmed: int
    bytes: int
    consumers: int
    handles: int
    oldest_age_seconds: float
    accepted: int
    redelivered: int
    rejected: int
    dead_lettered: int
    expired: int
    policy: QueuePolicy
    def __init__(self, uri: _Optional[str] = ..., ready: _Optional[int] = ..., unconfirmed: _Optional[int] = ..., bytes: _Optional[int] = ..., consumers: _Optional[int] = ..., handles: _Optional[int] = ..., oldest_age_seconds: _Optional[float] = ..., accepted: _Optional[int] = ..., redelivered: _Optional[int] = ..., rejected: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., expired: _Optional[int] = ..., policy: _Optional[_Union[QueuePolicy, _Mapping]] = ...) -> None: ...

class ListQueuesReply(_message.Message):
    __slots__ = ("status", "message", "queues")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ...) -> None: ...

class QueueRequest(_message.Message):
    __slots__ = ("uri",)
    URI_FIELD_NUMBER: _ClassVar[int]
    uri: str
    def __init__(self, uri: _Optional[str] = ...) -> None: ...

class QueueStatsReply(_message.Message):
    __slots__ = ("status", "message", "stats")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    stats: QueueStats
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., stats: _Optional[_Union[QueueStats, _Mapping]] = ...) -> None: ...

class PeekRequest(_message.Message):
    __slots__ = ("uri", "count", "skip")
    URI_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    uri: str
    count: int
    skip: int
    def __init__(self, uri: _Optional[str] = ..., count: _Optional[int] = ..., skip: _Optional[int] = ...) -> None: ...

class PeekedMessage(_message.Message):
    __slots__ = ("guid", "payload", "properties", "delivery_count", "age_seconds")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GUID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    guid: bytes
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    delivery_count: int
    age_seconds: float
    def __init__(self, guid: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., delivery_count: _Optional[int] = ..., age_seconds: _Optional[float] = ...) -> None: ...

class PeekReply(_message.Message):
    __slots__ = ("status", "message", "messages")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    messages: _containers.RepeatedCompositeFieldContainer[PeekedMessage]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[PeekedMessage, _Mapping]]] = ...) -> None: ...

class CountReply(_message.Message):
    __slots__ = ("status", "message", "count")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    count: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("uri", "policy")
    URI_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    uri: str
    policy: QueuePolicy
    def __init__(self, uri: _Optional[str] = ..., policy: _Optional[_Union[QueuePolicy, _Mapping]] = ...) -> None: ...

class PolicyReply(_message.Message):
    __slots__ = ("status", "message", "policy")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    policy: QueuePolicy
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., policy: _Optional[_Union[QueuePolicy, _Mapping]] = ...) -> None: ...

class ClientFrame(_message.Message):
    __slots__ = ("hello", "open_queue", "configure_queue", "close_queue", "puts", "confirms", "rejects", "count_consumers", "batch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    OPEN_QUEUE_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    CONFIRMS_FIELD_NUMBER: _ClassVar[int]
    REJECTS_FIELD_NUMBER: _ClassVar[int]
    COUNT_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    open_queue: OpenQueue
    configure_queue: ConfigureQueue
    close_queue: CloseQueue
    puts: PutBatch
    confirms: ConfirmBatch
    rejects: RejectBatch
    count_consumers: CountConsumers
    batch: ClientFrames
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., open_queue: _Optional[_Union[OpenQueue, _Mapping]] = ..., configure_queue: _Optional[_Union[ConfigureQueue, _Mapping]] = ..., close_queue: _Optional[_Union[CloseQueue, _Mapping]] = ..., puts: _Optional[_Union[PutBatch, _Mapping]] = ..., confirms: _Optional[_Union[ConfirmBatch, _Mapping]] = ..., rejects: _Optional[_Union[RejectBatch, _Mapping]] = ..., count_consumers: _Optional[_Union[CountConsumers, _Mapping]] = ..., batch: _Optional[_Union[ClientFrames, _Mapping]] = ...) -> None: ...

class ClientFrames(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[ClientFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[ClientFrame, _Mapping]]] = ...) -> None: ...

class ServerFrame(_message.Message):
    __slots__ = ("hello_reply", "response", "acks", "pushes", "error", "consumer_count", "batch")
    HELLO_REPLY_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    hello_reply: HelloReply
    response: Response
    acks: AckBatch
    pushes: PushBatch
    error: Error
    consumer_count: ConsumerCount
    batch: ServerFrames
    def __init__(self, hello_reply: _Optional[_Union[HelloReply, _Mapping]] = ..., response: _Optional[_Union[Response, _Mapping]] = ..., acks: _Optional[_Union[AckBatch, _Mapping]] = ..., pushes: _Optional[_Union[PushBatch, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., consumer_count: _Optional[_Union[ConsumerCount, _Mapping]] = ..., batch: _Optional[_Union[ServerFrames, _Mapping]] = ...) -> None: ...

class ServerFrames(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[ServerFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[ServerFrame, _Mapping]]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "client_id", "client_name", "accepts_batches", "relays_clients")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    RELAYS_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    client_id: str
    client_name: str
    accepts_batches: bool
    relays_clients: bool
    def __init__(self, protocol_version: _Optional[int] = ..., client_id: _Optional[str] = ..., client_name: _Optional[str] = ..., accepts_batches: _Optional[bool] = ..., relays_clients: _Optional[bool] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("protocol_version", "session_id", "dedup_window_ms", "max_payload_bytes", "max_properties", "max_properties_bytes", "broker_id", "accepts_batches")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    MAX_PROPERTIES_BYTES_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    session_id: str
    dedup_window_ms: int
    max_payload_bytes: int
    max_properties: int
    max_properties_bytes: int
    broker_id: str
    accepts_batches: bool
    def __init__(self, protocol_version: _Optional[int] = ..., session_id: _Optional[str] = ..., dedup_window_ms: _Optional[int] = ..., max_payload_bytes: _Optional[int] = ..., max_properties: _Optional[int] = ..., max_properties_bytes: _Optional[int] = ..., broker_id: _Optional[str] = ..., accepts_batches: _Optional[bool] = ...) -> None: ...

class QueueOptions(_message.Message):
    __slots__ = ("max_unconfirmed_messages", "max_unconfirmed_bytes")
    MAX_UNCONFIRMED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_UNCONFIRMED_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_unconfirmed_messages: int
    max_unconfirmed_bytes: int
    def __init__(self, max_unconfirmed_messages: _Optional[int] = ..., max_unconfirmed_bytes: _Optional[int] = ...) -> None: ...

class OpenQueue(_message.Message):
    __slots__ = ("request_id", "queue_id", "uri", "read", "write", "options", "for_client")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    FOR_CLIENT_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    uri: str
    read: bool
    write: bool
    options: QueueOptions
    for_client: str
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ..., uri: _Optional[str] = ..., read: _Optional[bool] = ..., write: _Optional[bool] = ..., options: _Optional[_Union[QueueOptions, _Mapping]] = ..., for_client: _Optional[str] = ...) -> None: ...

class ConfigureQueue(_message.Message):
    __slots__ = ("request_id", "queue_id", "options")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    options: QueueOptions
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ..., options: _Optional[_Union[QueueOptions, _Mapping]] = ...) -> None: ...

class CloseQueue(_message.Message):
    __slots__ = ("request_id", "queue_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue_id: int
    def __init__(self, request_id: _Optional[int] = ..., queue_id: _Optional[int] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("request_id", "status", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: Status
    message: str
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Put(_message.Message):
    __slots__ = ("queue_id", "guid", "payload", "properties", "age_ms")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    guid: bytes
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    age_ms: int
    def __init__(self, queue_id: _Optional[int] = ..., guid: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., age_ms: _Optional[int] = ...) -> None: ...

class IndexedProperties(_message.Message):
    __slots__ = ("index", "entries")
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    index: int
    entries: _containers.ScalarMap[str, str]
    def __init__(self, index: _Optional[int] = ..., entries: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PropertyGroup(_message.Message):
    __slots__ = ("indexes", "keys", "values")
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    indexes: _containers.RepeatedScalarFieldContainer[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, indexes: _Optional[_Iterable[int]] = ..., keys: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class PutBatch(_message.Message):
    __slots__ = ("queue_ids", "guids", "payloads", "payload_lengths", "ages_ms", "property_groups")
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    AGES_MS_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    guids: bytes
    payloads: bytes
    payload_lengths: _containers.RepeatedScalarFieldContainer[int]
    ages_ms: _containers.RepeatedScalarFieldContainer[int]
    property_groups: _containers.RepeatedCompositeFieldContainer[PropertyGroup]
    def __init__(self, queue_ids: _Optional[_Iterable[int]] = ..., guids: _Optional[bytes] = ..., payloads: _Optional[bytes] = ..., payload_lengths: _Optional[_Iterable[int]] = ..., ages_ms: _Optional[_Iterable[int]] = ..., property_groups: _Optional[_Iterable[_Union[PropertyGroup, _Mapping]]] = ...) -> None: ...

class AckBatch(_message.Message):
    __slots__ = ("queue_ids", "guids", "statuses")
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    guids: bytes
    statuses: bytes
    def __init__(self, queue_ids: _Optional[_Iterable[int]] = ..., guids: _Optional[bytes] = ..., statuses: _Optional[bytes] = ...) -> None: ...

class PushBatch(_message.Message):
    __slots__ = ("queue_ids", "guids", "payloads", "payload_lengths", "delivery_counts", "ages_ms", "property_groups")
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNTS_FIELD_NUMBER: _ClassVar[int]
    AGES_MS_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    guids: bytes
    payloads: bytes
    payload_lengths: _containers.RepeatedScalarFieldContainer[int]
    delivery_counts: _containers.RepeatedScalarFieldContainer[int]
    ages_ms: _containers.RepeatedScalarFieldContainer[int]
    property_groups: _containers.RepeatedCompositeFieldContainer[PropertyGroup]
    def __init__(self, queue_ids: _Optional[_Iterable[int]] = ..., guids: _Optional[bytes] = ..., payloads: _Optional[bytes] = ..., payload_lengths: _Optional[_Iterable[int]] = ..., delivery_counts: _Optional[_Iterable[int]] = ..., ages_ms: _Optional[_Iterable[int]] = ..., property_groups: _Optional[_Iterable[_Union[PropertyGroup, _Mapping]]] = ...) -> None: ...

class ConfirmBatch(_message.Message):
    __slots__ = ("queue_ids", "guids")
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    guids: bytes
    def __init__(self, queue_ids: _Optional[_Iterable[int]] = ..., guids: _Optional[bytes] = ...) -> None: ...

class RejectBatch(_message.Message):
    __slots__ = ("queue_ids", "guids", "requeue", "delay_ms")
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    guids: bytes
    requeue: _containers.RepeatedScalarFieldContainer[bool]
    delay_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, queue_ids: _Optional[_Iterable[int]] = ..., guids: _Optional[bytes] = ..., requeue: _Optional[_Iterable[bool]] = ..., delay_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("status", "message", "queue_id", "guids", "fatal")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    queue_id: int
    guids: _containers.RepeatedScalarFieldContainer[bytes]
    fatal: bool
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., queue_id: _Optional[int] = ..., guids: _Optional[_Iterable[bytes]] = ..., fatal: _Optional[bool] = ...) -> None: ...

class CountConsumers(_message.Message):
    __slots__ = ("request_id", "uri")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    uri: str
    def __init__(self, request_id: _Optional[int] = ..., uri: _Optional[str] = ...) -> None: ...

class ConsumerCount(_message.Message):
    __slots__ = ("request_id", "status", "message", "consumers")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: Status
    message: str
    consumers: int
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., consumers: _Optional[int] = ...) -> None: ...

class CommitMarkRequest(_message.Message):
    __slots__ = ("queue_uri", "app_id", "record", "version", "digest", "rows")
    QUEUE_URI_FIELD_NUMBER: _ClassVar[int]
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    queue_uri: str
    app_id: str
    record: bool
    version: int
    digest: bytes
    rows: int
    def __init__(self, queue_uri: _Optional[str] = ..., app_id: _Optional[str] = ..., record: _Optional[bool] = ..., version: _Optional[int] = ..., digest: _Optional[bytes] = ..., rows: _Optional[int] = ...) -> None: ...

class CommitMark(_message.Message):
    __slots__ = ("app_id", "version", "digest", "rows", "committed_at")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    version: int
    digest: bytes
    rows: int
    committed_at: float
    def __init__(self, app_id: _Optional[str] = ..., version: _Optional[int] = ..., digest: _Optional[bytes] = ..., rows: _Optional[int] = ..., committed_at: _Optional[float] = ...) -> None: ...

class CommitMarkReply(_message.Message):
    __slots__ = ("status", "message", "found", "mark")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    found: bool
    mark: CommitMark
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., found: _Optional[bool] = ..., mark: _Optional[_Union[CommitMark, _Mapping]] = ...) -> None: ...

class StagingRequest(_message.Message):
    __slots__ = ("queue_uri", "app_id", "version", "stage", "commit", "abort")
    QUEUE_URI_FIELD_NUMBER: _ClassVar[int]
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    queue_uri: str
    app_id: str
    version: int
    stage: StageRows
    commit: CommitStaged
    abort: bool
    def __init__(self, queue_uri: _Optional[str] = ..., app_id: _Optional[str] = ..., version: _Optional[int] = ..., stage: _Optional[_Union[StageRows, _Mapping]] = ..., commit: _Optional[_Union[CommitStaged, _Mapping]] = ..., abort: _Optional[bool] = ...) -> None: ...

class StageRows(_message.Message):
    __slots__ = ("partition", "attempt", "rows", "guids", "payloads", "payload_lengths", "property_columns", "properties")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    GUIDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    PROPERTY_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    partition: int
    attempt: int
    rows: _containers.RepeatedCompositeFieldContainer[Put]
    guids: bytes
    payloads: bytes
    payload_lengths: _containers.RepeatedScalarFieldContainer[int]
    property_columns: _containers.RepeatedCompositeFieldContainer[PropertyColumn]
    properties: _containers.RepeatedCompositeFieldContainer[IndexedProperties]
    def __init__(self, partition: _Optional[int] = ..., attempt: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[Put, _Mapping]]] = ..., guids: _Optional[bytes] = ..., payloads: _Optional[bytes] = ..., payload_lengths: _Optional[_Iterable[int]] = ..., property_columns: _Optional[_Iterable[_Union[PropertyColumn, _Mapping]]] = ..., properties: _Optional[_Iterable[_Union[IndexedProperties, _Mapping]]] = ...) -> None: ...

class PropertyColumn(_message.Message):
    __slots__ = ("name", "values")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class StagedAttempt(_message.Message):
    __slots__ = ("partition", "attempt", "rows")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    attempt: int
    rows: int
    def __init__(self, partition: _Optional[int] = ..., attempt: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class CommitStaged(_message.Message):
    __slots__ = ("attempts", "digest", "rows")
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    attempts: _containers.RepeatedCompositeFieldContainer[StagedAttempt]
    digest: bytes
    rows: int
    def __init__(self, attempts: _Optional[_Iterable[_Union[StagedAttempt, _Mapping]]] = ..., digest: _Optional[bytes] = ..., rows: _Optional[int] = ...) -> None: ...

class StagingReply(_message.Message):
    __slots__ = ("status", "message", "committed_before", "published", "discarded")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    committed_before: bool
    published: int
    discarded: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., committed_before: _Optional[bool] = ..., published: _Optional[int] = ..., discarded: _Optional[int] = ...) -> None: ...
