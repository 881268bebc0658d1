"""The REST gateway: produce, consume with leases, administer; ActiveMQ's MessageServlet calls too."""
