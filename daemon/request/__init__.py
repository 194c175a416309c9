"""The request path: what a request is and means, when it plays, where its audio comes from."""
