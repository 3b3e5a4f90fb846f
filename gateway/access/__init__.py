"""Who a request speaks for and what it may spend: bearer keys, keys made through the API, budgets, dashboard sign-in."""
