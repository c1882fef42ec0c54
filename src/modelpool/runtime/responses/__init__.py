"""Stored responses (the Responses API's `store` and `previous_response_id`)."""
