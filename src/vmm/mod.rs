//! Sandboxes: backends, layers, base images and the build executor.
