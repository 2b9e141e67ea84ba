"""Serving: routers between batches, the communication checks, the context ladder, the watchdog's report."""
