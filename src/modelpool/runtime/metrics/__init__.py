"""What the pool reports about its work: Prometheus metrics, their recent history, and how
a request's timing and usage reach them."""
