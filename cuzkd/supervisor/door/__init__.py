"""The front doors: gRPC servers where Curio dials cuzk, relaying to the engines behind them."""
