"""Media that requests carry (images), loaded under the server's safety rules."""
