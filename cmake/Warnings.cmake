set(STP_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-unused-parameter)
if(STP_WERROR)
  list(APPEND STP_WARNINGS -Werror)
endif()
