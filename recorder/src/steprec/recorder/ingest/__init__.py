"""Records in: OTLP Export requests and adopted journal segments, decoded at the trust boundary into
typed records or refusals, handed to the store's write path."""
