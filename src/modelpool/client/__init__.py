"""The client SDK: speaks HTTP to a modelpool server; never imports the runtime."""

from modelpool.client.admin import AdminClient, ClientError

__all__ = ["AdminClient", "ClientError"]
