"""Audio in and out: decoding uploads of any common format, encoding speech with a real codec."""
