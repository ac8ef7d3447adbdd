"""The built-in models, apart from the tasks that train them."""
