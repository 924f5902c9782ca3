"""The world side: catalogues, protocol, one game per JVM, pools of games. Never imports torch."""
