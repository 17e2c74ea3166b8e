"""The network sensor API (`gsim serve`): the gRPC server, its wire format (`sensor.proto` and the generated
modules), and the Python client."""
