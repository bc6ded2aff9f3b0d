"""The contract between engines and what watches them: the typed ``/status`` document, the
engine-side tracker, derived counters, salvage of odd documents, the supervisor's client."""
